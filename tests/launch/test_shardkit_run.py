"""Tests of the shardkit-run launcher (launch/tools/shardkit-run and its package launch/tools/shardkit_run/): the
command it builds.

Each test describes a machine with an Environment and checks the command built for it, so every case (GPUs or not,
root or not, Open MPI / MPICH / Slurm, no launcher) runs here whatever this machine is. The real script on this
machine: test_shardkit_run_real.py.
"""

import os
import shlex
import sys
from pathlib import Path

import pytest

TOOLS = Path(__file__).resolve().parents[2] / "launch" / "tools"
SOURCE = TOOLS / "shardkit-run"
sys.path.insert(0, str(TOOLS))

from shardkit_run import cli, command, detect, errors, launcher  # noqa: E402

PYTHON = sys.executable
OPENMPI = {"mpirun": "/usr/bin/mpirun", "mpiexec": "/usr/bin/mpiexec"}
MPICH = {"mpiexec": "/opt/mpich/bin/mpiexec"}
SRUN = {"srun": "/usr/bin/srun"}


def machine(cores=2, gpus=0, uid=1000, launchers=None, flavour="openmpi", **env):
    """An Environment: Open MPI on PATH unless told otherwise; keyword arguments become environment variables."""
    launchers = OPENMPI if launchers is None else launchers
    if not any(k in launchers for k in ("mpirun", "mpiexec")):
        flavour = ""
    env.setdefault("PATH", os.environ.get("PATH", os.defpath))
    return detect.Environment(cores=cores, gpus=gpus, uid=uid, launchers=launchers, mpi_flavour=flavour, env=env)


def build(args, environment):
    return launcher.build_command(cli.parse_args([*args, "prog", "--flag"]), environment)


def flag_value(command, flag):
    return command[command.index(flag) + 1]


# ---------------------------------------------------------------------------------------------------------------------
# Detection, from described inputs.


@pytest.mark.parametrize("value, count", [
    ("0,1,2,3", 4), ("3", 1), ("", 0), ("-1", 0), ("NoDevFiles", 0), ("0,-1,2", 1), ("0,,1", 1),
    ("GPU-5b6c1a2e-aaaa,GPU-77f0-bbbb", 2), ("MIG-0c5f", 1), (" 0, 1 ", 2),
])
def test_cuda_visible_devices_counts_entries_up_to_the_first_invalid_one(value, count):
    assert detect.count_cuda_visible_devices(value) == count


SMI_2_GPUS = "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-aaa)\nGPU 1: NVIDIA H100 80GB HBM3 (UUID: GPU-bbb)\n"
SMI_MIG = ("GPU 0: NVIDIA A100 (UUID: GPU-aaa)\n"
           "  MIG 3g.20gb Device 0: (UUID: MIG-x)\n  MIG 3g.20gb Device 1: (UUID: MIG-y)\n")


def test_nvidia_smi_lines_are_counted_and_mig_lines_are_not():
    assert detect.count_nvidia_smi_gpus(SMI_2_GPUS) == 2
    assert detect.count_nvidia_smi_gpus(SMI_MIG) == 1
    assert detect.count_nvidia_smi_gpus("") == 0


def test_gpu_count_rules():
    smi = lambda: SMI_2_GPUS  # noqa: E731
    no_smi = lambda: None  # noqa: E731
    assert detect.count_gpus({}, smi) == 2
    assert detect.count_gpus({}, no_smi) == 0
    assert detect.count_gpus({"CUDA_VISIBLE_DEVICES": "1"}, smi) == 1
    assert detect.count_gpus({"CUDA_VISIBLE_DEVICES": ""}, smi) == 0  # every GPU hidden
    assert detect.count_gpus({"CUDA_VISIBLE_DEVICES": "0,1,2,3"}, smi) == 2  # no more than are installed
    assert detect.count_gpus({"CUDA_VISIBLE_DEVICES": "0,1,2"}, no_smi) == 3
    # Under Slurm, the job's own GPUs only: never nvidia-smi's view of the whole node.
    assert detect.count_gpus({"SLURM_JOB_ID": "7"}, smi) == 0
    assert detect.count_gpus({"SLURM_JOB_ID": "7", "SLURM_GPUS_ON_NODE": "4"}, smi) == 4
    assert detect.count_gpus({"SLURM_JOB_ID": "7", "CUDA_VISIBLE_DEVICES": "0,1,2"}, smi) == 3


def fake_sysfs(tmp_path, topology):
    for cpu, (package, core) in enumerate(topology):
        d = tmp_path / f"cpu{cpu}" / "topology"
        d.mkdir(parents=True)
        (d / "physical_package_id").write_text(f"{package}\n")
        (d / "core_id").write_text(f"{core}\n")
    return str(tmp_path)


def test_physical_cores_count_hardware_threads_once(tmp_path):
    # 2 sockets x 2 cores x 2 threads, Linux numbering: cpu i and i+4 are siblings.
    sysfs = fake_sysfs(tmp_path, [(0, 0), (0, 1), (1, 0), (1, 1)] * 2)
    assert detect.count_physical_cores(range(8), sysfs) == 4
    assert detect.count_physical_cores([0, 4], sysfs) == 1  # the affinity set holds one core's two threads
    assert detect.count_physical_cores([0, 1, 2], sysfs) == 3
    assert detect.count_physical_cores([0, 1, 2], str(tmp_path / "missing")) == 3  # unreadable: logical CPUs


@pytest.mark.parametrize("text, flavour", [
    ("mpirun (Open MPI) 4.1.4\n\nReport bugs to http://www.open-mpi.org/community/help/\n", "openmpi"),
    ("mpirun (Open MPI) 5.0.3\n", "openmpi"),
    ("mpirun (OpenRTE) 2.1.1\n", "openmpi"),
    ("HYDRA build details:\n    Version:                                 4.0.2\n", "mpich"),
    ("Intel(R) MPI Library for Linux* OS, Version 2021.10\n", "unknown"),
    ("", "unknown"),
])
def test_mpi_flavour_from_version(text, flavour):
    assert detect.mpi_flavour_from_version(text) == flavour


def test_detect_environment_from_described_machine(tmp_path):
    found = {"mpirun": "/x/mpirun", "nvidia-smi": "/x/nvidia-smi"}
    outputs = {"--version": "mpirun (Open MPI) 4.1.4", "-L": SMI_2_GPUS}
    env = detect.detect_environment({"PATH": "/x"}, which=lambda name, path=None: found.get(name),
                                run=lambda cmd, env: outputs[cmd[-1]], cpus=[0, 1, 2, 3], uid=0,
                                sysfs=fake_sysfs(tmp_path, [(0, 0), (0, 1), (0, 0), (0, 1)]))
    assert (env.cores, env.gpus, env.uid, env.mpi_flavour) == (2, 2, 0, "openmpi")
    assert env.launchers == {"mpirun": "/x/mpirun"}
    empty = detect.detect_environment({"PATH": str(tmp_path)}, cpus=[0], uid=5)
    assert (empty.launchers, empty.mpi_flavour, empty.gpus, empty.cores) == ({}, "", 0, 1)


# ---------------------------------------------------------------------------------------------------------------------
# The command, Open MPI.


def test_default_np_is_the_gpu_count_with_gpus():
    launch = build([], machine(cores=16, gpus=4))
    assert launch.command == ["mpirun", "-n", "4", "--map-by", "slot:PE=4", "--bind-to", "core", "prog", "--flag"]
    assert launch.np == 4


def test_default_np_is_the_core_count_without_gpus():
    launch = build([], machine(cores=8, gpus=0))
    assert launch.command == ["mpirun", "-n", "8", "--map-by", "slot:PE=1", "--bind-to", "core", "prog", "--flag"]


def test_explicit_np_wins_over_gpus_and_cores():
    assert flag_value(build(["-n", "3"], machine(cores=16, gpus=8)).command, "-n") == "3"
    assert flag_value(build(["--np", "2"], machine(cores=8)).command, "-n") == "2"
    assert flag_value(build(["-n", "3"], machine(cores=16, gpus=8)).command, "--map-by") == "slot:PE=5"


def test_oversubscribe_only_when_more_ranks_than_cores():
    assert "--oversubscribe" not in build(["-n", "2"], machine(cores=2)).command
    assert "--oversubscribe" not in build(["-n", "1"], machine(cores=2)).command
    launch = build(["-n", "3"], machine(cores=2))
    assert launch.command == ["mpirun", "-n", "3", "--oversubscribe", "--bind-to", "none", "prog", "--flag"]
    # GPUs do not change the rule: slots are cores.
    assert "--oversubscribe" in build(["-n", "4"], machine(cores=2, gpus=4)).command


def test_root_settings_only_as_root():
    assert build([], machine(uid=0)).env == {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
    assert build([], machine(uid=1000)).env == {}
    # Only Open MPI needs them.
    assert build([], machine(uid=0, launchers=MPICH, flavour="mpich")).env == {}
    assert build([], machine(uid=0, launchers=SRUN, SLURM_JOB_ID="1")).env == {}


def test_explicit_binding_choices():
    env = machine(cores=4)
    assert build(["--bind", "none"], env).command[3:5] == ["--bind-to", "none"]
    assert build(["--bind", "core"], env).command[3:7] == ["--map-by", "core", "--bind-to", "core"]
    assert build(["--bind", "socket"], env).command[3:7] == ["--map-by", "socket", "--bind-to", "socket"]


def test_exports_use_dash_x_with_the_value_in_the_environment():
    launch = build(["-x", "FOO=a b,c", "-x", "EMPTY=", "-x", "HOME_COPY"], machine(uid=1000, HOME_COPY="/h"))
    assert launch.command[-8:-2] == ["-x", "FOO", "-x", "EMPTY", "-x", "HOME_COPY"]
    assert launch.env == {"FOO": "a b,c", "EMPTY": "", "HOME_COPY": "/h"}
    with pytest.raises(errors.LaunchError, match="NOT_SET is not set here"):
        build(["-x", "NOT_SET"], machine())
    with pytest.raises(errors.LaunchError, match="expected VAR=VALUE"):
        build(["-x", "1BAD=x"], machine())


def test_hosts_pass_through_and_count_slots():
    launch = build(["--hosts", "h1:4,h2:4"], machine(cores=2))
    assert launch.command == ["mpirun", "-n", "8", "--host", "h1:4,h2:4", "-x", "PATH", "prog", "--flag"]
    assert "--oversubscribe" in build(["--hosts", "h1:4,h2:4", "-n", "9"], machine()).command
    assert flag_value(build(["--hosts", "h1,h2,h3"], machine(cores=8)).command, "-n") == "3"  # one slot each
    with pytest.raises(errors.LaunchError, match="expected host"):
        build(["--hosts", "h1:0"], machine())


def test_hostfile_pass_through_and_slots(tmp_path):
    hostfile = tmp_path / "hosts"
    hostfile.write_text("# cluster\nnode1 slots=4\nnode2 slots=4 max_slots=8  # spare\n\n")
    launch = build(["--hostfile", str(hostfile)], machine(cores=2))
    assert launch.command == ["mpirun", "-n", "8", "--hostfile", str(hostfile), "-x", "PATH", "prog", "--flag"]
    assert "--oversubscribe" in build(["--hostfile", str(hostfile), "-n", "9"], machine()).command
    # Slots not declared: Open MPI counts the remote cores, which cannot be known here.
    hostfile.write_text("node1\nnode2\n")
    launch = build(["--hostfile", str(hostfile)], machine(cores=6))
    assert launch.command == ["mpirun", "-n", "12", "--hostfile", str(hostfile), "--oversubscribe", "-x", "PATH",
                              "prog", "--flag"]
    with pytest.raises(errors.LaunchError, match="No such file"):
        build(["--hostfile", str(tmp_path / "missing")], machine())


def test_several_hosts_with_gpus_place_one_rank_per_gpu_per_node():
    launch = build(["--hosts", "a:8,b:8"], machine(cores=32, gpus=8))
    assert launch.command == ["mpirun", "-n", "16", "--host", "a:8,b:8",
                              "--map-by", "ppr:8:node:PE=4", "--bind-to", "core", "-x", "PATH", "prog", "--flag"]


def test_several_hosts_forward_shardkit_variables():
    # ... but not the launcher's own (SHARDKIT_MPIRUN_ARGS, SHARDKIT_RUN_GRACE_S).
    env = machine(SHARDKIT_CHECK="1", SHARDKIT_MPIRUN_ARGS="--mca btl tcp,self", SHARDKIT_RUN_GRACE_S="5", OTHER="x")
    launch = build(["--hosts", "a:2,b:2"], env)
    assert launch.command == ["mpirun", "-n", "4", "--host", "a:2,b:2", "-x", "SHARDKIT_CHECK", "-x", "PATH",
                              "--mca", "btl", "tcp,self", "prog", "--flag"]
    assert launch.env == {"SHARDKIT_CHECK": "1"}
    assert launch.hosts == ["a", "b"]  # whom shardkit-run asks whether they answer, when it has to end mpirun
    # On one node the ranks inherit the environment anyway.
    assert "SHARDKIT_CHECK" not in build([], env).command


def test_several_hosts_forward_what_the_program_needs_to_start(tmp_path):
    # A far host starts ranks in an ssh login's environment: a bare python3 there is another Python unless PATH,
    # PYTHONPATH and the virtual environment go along. Only the variables that are set, values from this environment.
    env = machine(PATH="/venv/bin:/usr/bin", LD_LIBRARY_PATH="/opt/lib", PYTHONPATH="/src/build/python",
                  VIRTUAL_ENV="/venv", OTHER="x")
    hostfile = tmp_path / "hosts"
    hostfile.write_text("a slots=2\nb slots=2\n")
    for where in (["--hosts", "a:2,b:2"], ["--hostfile", str(hostfile)]):
        launch = build([*where, "-x", "PYTHONPATH=/elsewhere"], env)
        assert launch.command[launch.command.index("-x"):] == [
            "-x", "PYTHONPATH", "-x", "PATH", "-x", "LD_LIBRARY_PATH", "-x", "VIRTUAL_ENV", "prog", "--flag"]
        assert launch.env == {"PYTHONPATH": "/elsewhere"}  # an explicit -x wins, and is forwarded once
    assert "PYTHONHOME" not in build(["--hosts", "a:2,b:2"], env).command  # not set here: not forwarded
    # One node: the ranks inherit mpirun's environment, nothing to forward. MPICH's Hydra passes it all itself.
    assert "-x" not in build([], env).command
    mpich = machine(launchers=MPICH, flavour="mpich", PATH="/venv/bin:/usr/bin")
    assert "PATH" not in build(["--hosts", "a:2,b:2"], mpich).command


# ---------------------------------------------------------------------------------------------------------------------
# The command, MPICH and Slurm.


def test_mpich_uses_n_genv_and_hydra_binding():
    env = machine(cores=8, uid=0, launchers=MPICH, flavour="mpich")
    launch = build(["-n", "2", "-x", "FOO=bar baz"], env)
    assert launch.command == ["mpiexec", "-n", "2", "-bind-to", "core:4", "-genv", "FOO", "bar baz", "prog", "--flag"]
    assert launch.env == {}
    # Hydra needs no --oversubscribe.
    assert build(["-n", "16"], env).command == ["mpiexec", "-n", "16", "-bind-to", "none", "prog", "--flag"]


def test_mpich_hosts_and_hostfile(tmp_path):
    env = machine(cores=8, gpus=4, launchers=MPICH, flavour="mpich")
    assert build(["--hosts", "a:4,b:4"], env).command == [
        "mpiexec", "-n", "8", "-hosts", "a:4,b:4", "-ppn", "4", "-bind-to", "core:2", "prog", "--flag"]
    hostfile = tmp_path / "hosts"
    hostfile.write_text("a:4\nb:4\n")
    assert build(["--hostfile", str(hostfile), "--bind", "none"], env).command == [
        "mpiexec", "-n", "8", "-f", str(hostfile), "-bind-to", "none", "prog", "--flag"]


@pytest.mark.parametrize("launchers, flavour, few_cores, no_gpus, oversubscribed", [
    (OPENMPI, "openmpi", ["--map-by", "ppr:4:node", "--bind-to", "none"], "Open MPI", "--bind-to none"),
    (MPICH, "mpich", ["-ppn", "4"], "Hydra", "-bind-to none"),
])
def test_auto_binding_is_one_rule_in_each_mpi_spelling(launchers, flavour, few_cores, no_gpus, oversubscribed):
    def bind_flags(args, **described):
        launch = build(["--hosts", "a:4,b:4", *args], machine(launchers=launchers, flavour=flavour, **described))
        return launch.command[5:launch.command.index("prog")], launch.notes

    # Several hosts with GPUs but fewer cores than ranks per node: G ranks per node, unbound.
    flags, _ = bind_flags([], cores=2, gpus=4)
    assert flags[:len(few_cores)] == few_cores
    # Several hosts without GPUs: the MPI's own default.
    flags, notes = bind_flags([], cores=2)
    assert not any(flag.startswith(("--map-by", "--bind-to", "-bind-to", "-ppn")) for flag in flags)
    assert f"binding: {no_gpus}'s default on several hosts" in notes
    # More ranks than slots: unbound, and the same reason given.
    _, notes = bind_flags(["-n", "9"], cores=2)
    assert f"{oversubscribed}: more ranks than cores, bound ranks would share cores" in notes


def test_unknown_mpi_gets_plain_command_and_environment():
    env = machine(cores=4, launchers={"mpirun": "/opt/intel/bin/mpirun"}, flavour="unknown")
    launch = build(["-x", "A=1"], env)
    assert launch.command == ["mpirun", "-n", "4", "prog", "--flag"]
    assert launch.env == {"A": "1"}
    with pytest.raises(errors.LaunchError, match="neither Open MPI nor MPICH"):
        build(["--hosts", "a:2"], env)


def test_slurm_job_uses_srun():
    env = machine(cores=64, gpus=4, uid=0, launchers={**OPENMPI, **SRUN}, SLURM_JOB_ID="42", SLURM_NTASKS="8",
                  SLURM_JOB_NUM_NODES="2", SLURM_GPUS_ON_NODE="4")
    launch = build(["-x", "FOO=a,b"], env)
    assert launch.command == ["srun", "-n", "8", "--gpus-per-task=1", "--export=ALL,FOO", "prog", "--flag"]
    assert launch.env == {"FOO": "a,b"}  # srun reads the value from its environment: commas are safe
    assert launch.launcher == "srun"


def test_slurm_default_np_without_ntasks_and_extra_args():
    env = machine(cores=2, gpus=4, launchers=SRUN, SLURM_JOB_ID="42", SLURM_JOB_NUM_NODES="2",
                  SHARDKIT_SRUN_ARGS="--mpi=pmix --cpus-per-task=8")
    assert build(["--bind", "core"], env).command == [
        "srun", "-n", "8", "--ntasks-per-node=4", "--gpus-per-task=1", "--cpu-bind=cores",
        "--mpi=pmix", "--cpus-per-task=8", "prog", "--flag"]
    # More ranks than GPUs: they share them, so no --gpus-per-task (srun would wait for GPUs that do not exist).
    assert build(["-n", "16"], env).command[:3] == ["srun", "-n", "16"]
    assert "--gpus-per-task=1" not in build(["-n", "16"], env).command
    # Without GPUs: the CPUs Slurm gave this node.
    env = machine(cores=2, launchers=SRUN, SLURM_JOB_ID="42", SLURM_CPUS_ON_NODE="6")
    assert build([], env).command == ["srun", "-n", "6", "prog", "--flag"]


def test_slurm_with_launcher_mpirun_and_without_srun():
    env = machine(cores=8, launchers={**OPENMPI, **SRUN}, SLURM_JOB_ID="42", SLURM_NTASKS="4")
    launch = build(["--launcher", "mpirun"], env)
    assert launch.command == ["mpirun", "-n", "4", "prog", "--flag"]  # the allocation places the ranks
    # SLURM_JOB_ID without srun on PATH (a container inside a job): mpirun.
    assert build([], machine(cores=8, SLURM_JOB_ID="42", SLURM_NTASKS="4")).command[0] == "mpirun"
    with pytest.raises(errors.LaunchError, match="are for mpirun"):
        build(["--hosts", "a:2"], machine(launchers=SRUN, SLURM_JOB_ID="42"))


def test_srun_outside_a_job_only_when_nothing_else():
    assert build([], machine(launchers={**OPENMPI, **SRUN})).command[0] == "mpirun"
    assert build([], machine(cores=3, launchers=SRUN)).command == ["srun", "-n", "3", "prog", "--flag"]
    with pytest.raises(errors.LaunchError) as e:
        build(["--launcher", "srun"], machine())
    assert e.value.code == 127


# ---------------------------------------------------------------------------------------------------------------------
# main(): messages and exit status.


def test_no_launcher_exits_127_with_what_to_install(capsys):
    assert cli.main(["--dry-run", PYTHON], machine(launchers={})) == 127
    err = capsys.readouterr().err
    assert "no MPI launcher found" in err and "apt-get install openmpi-bin" in err


def test_missing_program_fails_early(capsys, tmp_path):
    assert cli.main(["--dry-run", "-n", "2", "no-such-program-shardkit"], machine()) == 127
    assert "program 'no-such-program-shardkit' not found: not a path, and not on PATH" in capsys.readouterr().err
    assert cli.main(["--dry-run", str(tmp_path / "nope")], machine()) == 127
    assert "not found: no such file" in capsys.readouterr().err
    script = tmp_path / "script.py"
    script.write_text("print(1)\n")
    assert cli.main(["--dry-run", str(script)], machine()) == 126
    assert "run it through its interpreter" in capsys.readouterr().err


def test_dry_run_prints_one_shell_line(capsys):
    args = ["--dry-run", "-n", "2", "-x", "MSG=hello world", PYTHON, "-c", "print('a b')"]
    assert cli.main(args, machine(uid=0)) == 0
    out = capsys.readouterr().out
    assert out.count("\n") == 1
    words = shlex.split(out)
    assert words == ["OMPI_ALLOW_RUN_AS_ROOT=1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1", "MSG=hello world", "mpirun", "-n",
                     "2", "--map-by", "slot:PE=1", "--bind-to", "core", "-x", "MSG", PYTHON, "-c", "print('a b')"]


def test_usage_errors_exit_2(capsys):
    assert cli.main(["--dry-run"], machine()) == 2
    assert "no program given" in capsys.readouterr().err
    assert cli.main(["-n", "0", PYTHON], machine()) == 2
    assert cli.main(["--hosts", "a", "--hostfile", "f", PYTHON], machine()) == 2
    assert cli.main(["--help"], machine()) == 0
    assert "--oversubscribe" in capsys.readouterr().out


def test_program_arguments_are_left_alone():
    assert cli.parse_args(["-n", "2", "--", "prog", "-n", "5", "--dry-run"]).program == ["prog", "-n", "5", "--dry-run"]
    options = cli.parse_args(["--dry-run", "prog", "--", "--verbose"])
    assert options.dry_run and not options.verbose and options.program == ["prog", "--", "--verbose"]


# ---------------------------------------------------------------------------------------------------------------------
# The real script on this machine.
