"""The GPU image installs the fbgemm-gpu that pairs with its torch (issue #28 §4): fbgemm-gpu 1.X is built for
torch 2.(X+5); any other pair fails at import with an undefined symbol. TorchRec 1.X goes with fbgemm-gpu 1.X."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def paired_torch_minor(fbgemm_version: str) -> int:
    major, minor = (int(part) for part in fbgemm_version.split(".")[:2])
    assert major == 1, f"fbgemm-gpu {fbgemm_version}: the pairing rule is known for 1.X only"
    return minor + 5


def test_gpu_image_pairs_fbgemm_gpu_with_its_torch() -> None:
    dockerfile = (REPO / "deploy" / "Dockerfile").read_text()
    torch_pins = re.findall(r"torch==(\d+)\.(\d+)\.\d+", dockerfile)
    assert torch_pins and len(set(torch_pins)) == 1, torch_pins
    torch_major, torch_minor = (int(v) for v in torch_pins[0])
    fbgemm = re.search(r"^ARG FBGEMM_GPU_VERSION=(\S+)$", dockerfile, re.MULTILINE)
    assert fbgemm, "deploy/Dockerfile declares no FBGEMM_GPU_VERSION"
    assert (torch_major, torch_minor) == (2, paired_torch_minor(fbgemm.group(1))), (torch_pins, fbgemm.group(1))
    # Installed from torch's own (CUDA) index on the GPU build only, replacing the CPU build of the same module.
    install = dockerfile[dockerfile.index("ARG FBGEMM_GPU_VERSION"):]
    assert '*/cpu) ;;' in install and "pip uninstall -y fbgemm_gpu-cpu" in install
    assert '--index-url "$TORCH_INDEX" "fbgemm-gpu==$FBGEMM_GPU_VERSION"' in install
    assert '"torchrec==$FBGEMM_GPU_VERSION"' in install
    # The CPU build pinned for everything else is the same release (requirements.txt), and so is the Makefile's
    # TorchRec.
    cpu_pin = re.search(r"^fbgemm_gpu-cpu==(\S+)$", (REPO / "requirements.txt").read_text(), re.MULTILINE)
    assert cpu_pin and cpu_pin.group(1) == fbgemm.group(1)
    torchrec = re.search(r"^TORCHREC := torchrec==(\S+)$", (REPO / "Makefile").read_text(), re.MULTILINE)
    assert torchrec and torchrec.group(1) == fbgemm.group(1)


def test_gpu_image_installs_tensorflows_cuda_build_of_the_pinned_release() -> None:
    """device auto refuses a GPU node whose GPUs the framework cannot use, so the GPU image's TensorFlow must be
    the CUDA build: requirements.txt's tensorflow-cpu release, its other pins kept as constraints."""
    dockerfile = (REPO / "deploy" / "Dockerfile").read_text()
    install = dockerfile[dockerfile.index("ARG FBGEMM_GPU_VERSION"):]
    gpu_branch = install[install.index('*/cpu) ;;'):install.index("esac")]
    assert "pip uninstall -y fbgemm_gpu-cpu tensorflow-cpu" in gpu_branch
    assert "pip install --no-cache-dir -c /tmp/requirements-but-torch.txt" in gpu_branch
    assert "\"tensorflow[and-cuda]==$(sed -n 's/^tensorflow-cpu==//p' requirements.txt)\"" in gpu_branch
    assert re.search(r"^tensorflow-cpu==\d+\.\d+\.\d+$", (REPO / "requirements.txt").read_text(), re.MULTILINE)


def test_the_pins_are_installed_around_the_images_own_torch() -> None:
    """requirements.txt pins the CPU wheel (+cpu), which the GPU image's CUDA torch does not satisfy and PyPI does
    not serve: the image installs every other pin, with torch taken from TORCH_INDEX first."""
    assert re.search(r"^torch==\S+\+cpu$", (REPO / "requirements.txt").read_text(), re.MULTILINE)
    dockerfile = (REPO / "deploy" / "Dockerfile").read_text()
    torch_first = dockerfile.index('--index-url "$TORCH_INDEX" torch==')
    assert "grep -v '^torch==' requirements.txt > /tmp/requirements-but-torch.txt" in dockerfile[torch_first:]
    assert "-r /tmp/requirements-but-torch.txt" in dockerfile and "-r requirements.txt" not in dockerfile


def test_pairing_rule() -> None:
    assert paired_torch_minor("1.8.0") == 13 and paired_torch_minor("1.6.0") == 11


def _nvt_guard() -> str:
    """The Dockerfile's check before /opt/nvtabular is built, as its RUN line hands it to sh."""
    dockerfile = (REPO / "deploy" / "Dockerfile").read_text()
    start = dockerfile.index('RUN case "$NVT_GPU_PACKAGES"')
    return dockerfile[start + len("RUN "):dockerfile.index("esac", start) + len("esac")]


def test_gpu_image_refuses_cudf_23_08_on_its_python_in_one_line(tmp_path: Path) -> None:
    """cuDF 23.08 (NVTabular 23.08's) has wheels for Python 3.9-3.10 only and the image is Python 3.11: the build
    stops before pip with one line naming both, and builds without cuDF (the compose default) pass. Run with sh and
    a `python` of each version (this machine has no Docker)."""
    import subprocess
    import sys

    def build(packages: str, python_version: str) -> subprocess.CompletedProcess:
        bin_dir = tmp_path / python_version
        bin_dir.mkdir(exist_ok=True)
        major, minor = python_version.split(".")[:2]
        (bin_dir / "python").write_text(  # the image's `python`: this interpreter, reporting `python_version`
            "#!/bin/sh\nexec " + sys.executable + " -c \"import sys, platform; "
            f"sys.version_info = ({major}, {minor}, 0); platform.python_version = lambda: '{python_version}'; "
            "exec(sys.argv[1])\" \"$2\"\n")
        (bin_dir / "python").chmod(0o755)
        return subprocess.run(["sh", "-c", _nvt_guard()], capture_output=True, text=True,
                              env={"PATH": f"{bin_dir}:/usr/bin:/bin", "NVT_GPU_PACKAGES": packages})

    cudf = "cudf-cu11==23.8.* dask-cudf-cu11==23.8.* rmm-cu11==23.8.*"
    refused = build(cudf, "3.11.9")
    assert refused.returncode == 1 and refused.stdout == "", refused
    line = refused.stderr.strip()
    assert "\n" not in line and "Python 3.9-3.10 only" in line and "Python 3.11.9" in line, line
    assert "leave NVT_GPU_PACKAGES empty" in line and 'docs/nvtabular.md "GPU"' in line
    assert build(cudf, "3.10.14").returncode == 0
    assert build("", "3.11.9").returncode == 0
