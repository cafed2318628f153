"""Tests of the shardkit-run launcher (launch/tools/shardkit-run and its package launch/tools/shardkit_run/).

Most tests describe a machine with an Environment and check the command built for it, so every case (GPUs or not,
root or not, Open MPI / MPICH / Slurm, no launcher) runs here whatever this machine is. The last ones run the real
script on this machine: --dry-run, then real jobs of 2 ranks (a Python program, and examples/hello when ctest passes
its path in SHARDKIT_HELLO). SHARDKIT_RUN names the built script; without it the source script is used.
"""

import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

TOOLS = Path(__file__).resolve().parents[2] / "launch" / "tools"
SOURCE = TOOLS / "shardkit-run"
sys.path.insert(0, str(TOOLS))

from shardkit_run import cli, command, detect, errors, launcher, supervise  # noqa: E402

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


def script_command():
    built = os.environ.get("SHARDKIT_RUN")
    return [built] if built else [PYTHON, str(SOURCE)]


def run_script(args, env=None, timeout=120):
    return subprocess.run(script_command() + list(args), capture_output=True, text=True, timeout=timeout,
                          env=env if env is not None else os.environ.copy())


def test_built_script_is_the_source():
    built = os.environ.get("SHARDKIT_RUN")
    if not built:
        pytest.skip("SHARDKIT_RUN not set (ctest sets it to the built bin/shardkit-run)")
    assert os.access(built, os.X_OK)
    assert Path(built).read_bytes() == SOURCE.read_bytes()
    # The package, where the script looks for it: every module, as in the source tree.
    package = Path(built).resolve().parent.parent / "share" / "shardkit" / "shardkit_run"
    for module in (TOOLS / "shardkit_run").glob("*.py"):
        assert (package / module.name).read_bytes() == module.read_bytes(), module.name


def test_cli_dry_run_on_this_machine():
    result = run_script(["--dry-run", "--verbose", "-x", "SHARDKIT_TEST_VALUE=1 2", PYTHON, "-c", "pass"])
    environment = detect.detect_environment()
    if environment.mpi_launcher is None and "srun" not in environment.launchers:
        assert result.returncode == 127 and "no MPI launcher found" in result.stderr
        return
    assert result.returncode == 0, result.stderr
    options = cli.parse_args(["-x", "SHARDKIT_TEST_VALUE=1 2", PYTHON, "-c", "pass"])
    expected = launcher.build_command(options, environment)
    assert result.stdout == command.format_command(expected) + "\n"
    assert "shardkit-run: detected" in result.stderr


def test_cli_without_any_launcher_on_path(tmp_path):
    env = {**os.environ, "PATH": str(tmp_path)}  # nothing on PATH: the program is given by its full path
    result = subprocess.run([PYTHON, str(SOURCE), "--dry-run", PYTHON], capture_output=True, text=True,
                            timeout=60, env=env)
    assert result.returncode == 127
    assert "no MPI launcher found" in result.stderr and "apt-get install openmpi-bin" in result.stderr


def need_launcher():
    if not (shutil.which("mpirun") or shutil.which("mpiexec") or shutil.which("srun")):
        pytest.skip("no MPI launcher on this machine")


# The rank, from whichever launcher started the process.
RANK = """
import os, sys
names = ("OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID")
rank = next((os.environ[n] for n in names if n in os.environ), None)
"""
# One write per line: print() writes its pieces one by one, and under load the launcher forwarded "rank" from one rank
# and " 0 ..." after another rank's "rank" (seen once in CI).
RANK_PROGRAM = RANK + 'os.write(1, f"rank {rank} {os.environ.get(\'SHARDKIT_TEST_VALUE\')}\\n".encode())\n'
FAIL_ON_RANK_1_PROGRAM = RANK + 'sys.exit(3 if rank == "1" else 0)\n'


def test_real_run_of_two_python_ranks():
    need_launcher()
    result = run_script(["-n", "2", "-x", "SHARDKIT_TEST_VALUE=passed through", PYTHON, "-c", RANK_PROGRAM])
    assert result.returncode == 0, result.stdout + result.stderr
    lines = sorted(line for line in result.stdout.splitlines() if line.startswith("rank "))
    assert lines == ["rank 0 passed through", "rank 1 passed through"], result.stdout + result.stderr
    assert result.stderr.startswith("shardkit-run: ")  # the command, printed before it runs


def test_real_run_passes_on_a_failing_exit_status():
    need_launcher()
    result = run_script(["-n", "2", PYTHON, "-c", FAIL_ON_RANK_1_PROGRAM])
    assert result.returncode != 0, result.stdout + result.stderr


def test_real_run_of_hello_example():
    hello = os.environ.get("SHARDKIT_HELLO")
    if not hello:
        pytest.skip("SHARDKIT_HELLO not set (ctest sets it to the built examples/hello)")
    need_launcher()
    result = run_script(["-n", "2", hello])
    assert result.returncode == 0, result.stdout + result.stderr
    assert "rank 0/2" in result.stdout and "rank 1/2" in result.stdout, result.stdout + result.stderr


# ---------------------------------------------------------------------------------------------------------------------
# Watching mpirun (supervise.py), with a stand-in mpirun on PATH: what it prints and how it ends is up to each test.

FAKE_MPIRUN = """
import os, signal, subprocess, sys, time
if sys.argv[1:] == ["--version"]:
    print("mpirun (Open MPI) 4.1.4")
    sys.exit(0)
mode = os.environ["FAKE_MPIRUN_MODE"]
say = lambda fd, text: os.write(fd, text.encode())
if mode == "abort_then_hang":
    # A daemon that mpirun started, deaf to SIGTERM as mpirun is here; both must be gone when shardkit-run returns.
    helper = subprocess.Popen([sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, "
                               "signal.SIG_IGN); print(flush=True); time.sleep(20)"], stdout=subprocess.PIPE)
    helper.stdout.readline()
    say(1, f"helper {helper.pid}\\n")
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    say(2, "shardkit: rank 0: ending the job (MPI_Abort): TimeoutError: allreduce on communicator 'world' "
           "timed out after 5 s: rank(s) 2, 3 did not arrive (skipped this collective, stuck, or lost)\\n")
    time.sleep(20)
elif mode == "abort_then_exit":
    say(2, "MPI_ABORT was invoked on rank 1 in communicator MPI_COMM_WORLD\\nwith errorcode 7.\\n")
    time.sleep(0.3)
    sys.exit(7)
elif mode == "echo_stdin":
    say(1, "rank 0 read: " + sys.stdin.read())
    say(2, "to stderr\\n")
elif mode == "deaf_to_sigint":
    signal.signal(signal.SIGINT, lambda *a: say(2, "mpirun got SIGINT\\n"))
    say(2, "ready\\n")
    time.sleep(20)
"""


def fake_mpirun_env(tmp_path, mode, grace="1"):
    fake = tmp_path / "mpirun"
    fake.write_text(f"#!{PYTHON}\n{FAKE_MPIRUN}")
    fake.chmod(0o755)
    return {**os.environ, "PATH": f"{tmp_path}{os.pathsep}{os.environ.get('PATH', '')}", "FAKE_MPIRUN_MODE": mode,
            "SHARDKIT_RUN_GRACE_S": grace}


def alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] if Path(f"/proc/{pid}").exists() else ""
    return state != "Z"  # a zombie has ended; its parent (reparented: init) has yet to reap it


def test_a_job_ended_by_a_rank_ends_when_mpirun_does_not(tmp_path):
    # mpirun still waiting after the abort (a host it cannot reach), deaf to SIGTERM: ended after the 1 s grace period,
    # then the hosts probed (up to 2 s). A name under .invalid never resolves (RFC 6761): no answer from it, whatever
    # the network here (some sandboxes accept every connection).
    start = time.monotonic()
    result = run_script(["--launcher", "mpirun", "--hosts", "localhost:2,nohost.invalid:2", "true"],
                        env=fake_mpirun_env(tmp_path, "abort_then_hang"), timeout=30)
    elapsed = time.monotonic() - start
    output = result.stdout + result.stderr
    assert result.returncode == 1, output
    assert elapsed < 1 + 2 + 3, f"took {elapsed:.1f} s\n{output}"
    # What mpirun printed, unchanged, then shardkit-run's own account naming the ranks that never arrived and the
    # host that does not answer (localhost refuses or accepts: it answers).
    assert "shardkit: rank 0: ending the job (MPI_Abort): TimeoutError: allreduce" in result.stderr
    assert ("shardkit-run: rank 0 ended the job (MPI_Abort) 1 s ago and mpirun has not ended (rank(s) 2, 3 did not "
            "arrive: is their host unreachable?); ending mpirun") in result.stderr, output
    assert "shardkit-run: host(s) not answering on TCP port 22 within 2 s: nohost.invalid\n" in result.stderr, output
    helper = int(re.search(r"helper (\d+)", result.stdout)[1])
    assert not alive(helper), f"mpirun's helper {helper} still runs"


@pytest.mark.parametrize("lines, rank, status", [
    ([b"shardkit: rank 3: ending the job (MPI_Abort): uncaught TimeoutError on rank 3\n"], 3, 1),
    ([b"MPI_ABORT was invoked on rank 1 in communicator MPI_COMM_WORLD\n", b"with errorcode 42.\n"], 1, 42),
    ([b"application called MPI_Abort(MPI_COMM_WORLD, 5) - process 2\n"], 2, 5),  # MPICH
])
def test_the_signs_of_an_ended_job_are_read_across_chunks(lines, rank, status):
    watch = supervise._Watch()
    text = b"rank 0 says hello\n" + b"".join(lines)
    for i in range(0, len(text), 7):  # as a pipe may cut it
        watch.feed(text[i:i + 7])
    assert watch.ending is not None and watch.ending.what == f"rank {rank} ended the job (MPI_Abort)"
    assert watch.ending.status == status
    quiet = supervise._Watch()
    quiet.feed(b"rank 0: the word MPI_Abort alone is not a sign\n")
    assert quiet.ending is None


@pytest.mark.parametrize("value", ["soon", "-1", "nan"])
def test_a_grace_period_that_is_not_seconds_is_refused(tmp_path, value):
    result = run_script(["--launcher", "mpirun", "-n", "2", "true"],
                        env=fake_mpirun_env(tmp_path, "echo_stdin", grace=value))
    assert result.returncode == 2, result.stdout + result.stderr
    assert (f"shardkit-run: error: SHARDKIT_RUN_GRACE_S={value}: expected seconds (a number >= 0, or inf)"
            in result.stderr)


def test_mpirun_ending_by_itself_keeps_its_exit_status(tmp_path):
    start = time.monotonic()
    result = run_script(["--launcher", "mpirun", "-n", "2", "true"],
                        env=fake_mpirun_env(tmp_path, "abort_then_exit", grace="20"))
    assert result.returncode == 7 and time.monotonic() - start < 10, result.stdout + result.stderr
    assert "MPI_ABORT was invoked on rank 1 in communicator MPI_COMM_WORLD\nwith errorcode 7.\n" in result.stderr
    assert "has not ended" not in result.stderr


def test_stdin_stdout_and_stderr_pass_through(tmp_path):
    result = subprocess.run(script_command() + ["--launcher", "mpirun", "-n", "2", "true"], input="some input\n",
                            capture_output=True, text=True, timeout=60, env=fake_mpirun_env(tmp_path, "echo_stdin"))
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout == "rank 0 read: some input\n"
    assert result.stderr.endswith("\nto stderr\n"), result.stderr


def test_a_signal_is_passed_on_and_ends_the_job_after_the_grace_period(tmp_path):
    # SIGINT from elsewhere than the terminal reaches mpirun once; an mpirun that does not end is ended.
    job = subprocess.Popen(script_command() + ["--launcher", "mpirun", "-n", "2", "true"], stderr=subprocess.PIPE,
                           text=True, env=fake_mpirun_env(tmp_path, "deaf_to_sigint"), start_new_session=True)
    assert job.stderr is not None
    lines = [job.stderr.readline(), job.stderr.readline()]
    assert lines[1] == "ready\n", lines
    start = time.monotonic()
    job.send_signal(signal.SIGINT)
    _, rest = job.communicate(timeout=30)
    assert job.returncode == 130 and time.monotonic() - start < 1 + 2, rest
    assert rest.count("mpirun got SIGINT") == 1, rest
    assert "shardkit-run: got SIGINT 1 s ago and mpirun has not ended; ending mpirun" in rest, rest
