#pragma once

// The process's poster of pending point-to-point sends (shm_p2p.hpp): one thread, started the first time a send finds
// its ring full, that posts what every communicator's pending sends have room for, whatever the thread that sent them
// does meanwhile (an operation on another communicator, a blocking MPI call, its own computation). Open MPI's eager
// sends complete in its progress engine, which runs only inside MPI calls; this goes further, since a rank blocked in
// MPI_Scan, MPI_Comm_split or the application's own MPI call could not post them otherwise, and its receiver may wait
// for them before it comes.
//
// It also keeps every live ShmP2p, for shutdown (shm_poster_close_all).
//
// It sleeps on the doorbell of a sender with sends still pending (receivers ring it as they free entries; at most
// 50 ms), and on a condition variable while nothing is pending. Where a sender's owner is inside it (its lock held: a
// send, receive or wait of its own, which posts them itself), it leaves that one and looks again later.

namespace shardkit::detail {

class ShmP2p;

/// `p` is alive (from its constructor): shutdown closes it (below).
void shm_poster_track(ShmP2p& p);
/// `p` has sends pending: the poster posts them until none is left (ShmP2p::post_in_background). Called with `p`'s
/// lock held (the poster only ever tries that lock, so the order cannot deadlock).
void shm_poster_add(ShmP2p& p);
/// `p` is going away: once this returns the poster no longer touches it (nor its segment). Never throws.
void shm_poster_remove(ShmP2p& p) noexcept;
/// Shutdown (the Runtime's set_before_finalize, registered with the first ShmP2p): closes the end of every ShmP2p
/// still alive (communicators never freed), so that no peer waits for room this rank will never make, then waits until
/// their pending sends are posted or dropped (up to the latest of their timeouts, or a signal) and warns of what was
/// lost. Without it a rank freeing its communicator with sends pending to a rank that kept its own waited for good,
/// while that rank waited for it in MPI_Finalize; MPI_Finalize drops unreceived messages.
void shm_poster_close_all() noexcept;

}  // namespace shardkit::detail
