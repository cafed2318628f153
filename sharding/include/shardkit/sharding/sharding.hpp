#pragma once

// Everything of the sharding layer: meshes, partition specs, sharded arrays and shard_map.
#include "shardkit/sharding/axis_plan.hpp"
#include "shardkit/sharding/matmul.hpp"
#include "shardkit/sharding/mesh.hpp"
#include "shardkit/sharding/named_sharding.hpp"
#include "shardkit/sharding/partition_spec.hpp"
#include "shardkit/sharding/reshard.hpp"
#include "shardkit/sharding/shard_map.hpp"
#include "shardkit/sharding/sharded_array.hpp"
