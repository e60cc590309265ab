"""The operator's OCI image, built without an engine, is the Dockerfile's image.

hack/image/build.sh runs the Dockerfile's stages in Debian roots made by
mmdebstrap and packs the result with umoci (no engine, no registry here). This
builds it (or reuses the cached archive), unpacks it, and checks what a cluster
would see: the config the Dockerfile declares, the chart's image name, exactly
the distributions that the Dockerfile's own install script builds from the same
context, and that the entrypoint runs as the Dockerfile's user on a read-only
root filesystem with nowhere to write (as the chart's securityContext runs it).
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import tarfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.e2e.test_image_recipe import build_context, run, venv

ROOT = Path(__file__).resolve().parents[2]
FINAL_STAGE = (ROOT / "Dockerfile").read_text().split("\nFROM ")[-1]
TOOLS = {
    "umoci": "umoci",
    "mmdebstrap": "mmdebstrap",
    "unshare": "util-linux",
    "chroot": "coreutils",
}
# The first test also waits for the build (about 1.5 min, more on a cold network).
pytestmark = pytest.mark.timeout(1800)
SITE = "usr/local/lib/python3.11/dist-packages"  # where pip installs as root on Debian


@dataclass(frozen=True)
class Image:
    archive: Path
    index: dict[str, Any]
    config: dict[str, Any]
    rootfs: Path


def dockerfile_env() -> dict[str, str]:
    """The final stage's ENV pairs (continuation lines joined)."""
    joined = FINAL_STAGE.replace("\\\n", " ")
    env: dict[str, str] = {}
    for line in re.findall(r"^ENV (.+)$", joined, re.MULTILINE):
        for word in shlex.split(line):
            key, value = word.split("=", 1)
            env[key] = value
    assert env
    return env


def instruction(keyword: str) -> str:
    found = re.search(rf"^{keyword} (.+)$", FINAL_STAGE, re.MULTILINE)
    assert found, keyword
    return found.group(1).strip()


@pytest.fixture(scope="module")
def image(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Image]:
    missing = [f"{t} (apt-get install -y {p})" for t, p in TOOLS.items() if not shutil.which(t)]
    assert not missing, f"missing tools: {', '.join(missing)}"
    built = subprocess.run(
        ["bash", str(ROOT / "hack/image/build.sh")],
        capture_output=True,
        text=True,
        timeout=1800,
        check=False,
    )
    assert built.returncode == 0, built.stderr[-3000:]
    archive = Path(built.stdout.strip())
    assert archive.name.startswith("headroom-"), built.stdout

    layout = tmp_path_factory.mktemp("layout")
    with tarfile.open(archive) as tar:
        tar.extractall(layout, filter="data")

    def blob(digest: str) -> Any:
        algorithm, value = digest.split(":")
        return json.loads((layout / "blobs" / algorithm / value).read_text())

    index = json.loads((layout / "index.json").read_text())
    (entry,) = index["manifests"]
    config = blob(blob(entry["digest"])["config"]["digest"])
    tag = entry["annotations"]["org.opencontainers.image.ref.name"]
    bundle = tmp_path_factory.mktemp("bundle") / "b"
    subprocess.run(
        ["umoci", "unpack", "--image", f"{layout}:{tag}", str(bundle)],
        check=True,
        capture_output=True,
    )
    yield Image(archive, index, config, bundle / "rootfs")
    shutil.rmtree(bundle.parent)  # about 300 MB; pytest would keep three runs of it
    shutil.rmtree(layout)


def in_image(
    image: Image, argv: list[str], *, as_user: bool = True, config_dir: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """Run argv in the image as a runtime would with readOnlyRootFilesystem: a private
    mount namespace, the root bind-mounted read-only, the host's /dev, the image's
    Env only, and (as_user) the image's User with no supplementary groups."""
    rootfs = image.rootfs
    mounts = [f"mount --bind {rootfs} {rootfs}", f"mount --bind /dev {rootfs}/dev"]
    if config_dir is not None:  # as the chart mounts its ConfigMap: read-only
        target = rootfs / "etc/headroom"
        target.mkdir(exist_ok=True)  # the mount point a runtime would create
        mounts.append(f"mount --bind -o ro {config_dir} {target}")
    mounts.append(f"mount -o remount,bind,ro {rootfs}")
    user = []
    if as_user:
        uid, gid = image.config["config"]["User"].split(":")
        user = ["/usr/bin/setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups"]
    # HOME=/ as an engine sets it for a user without a passwd entry.
    env = ["/usr/bin/env", "-i", "HOME=/", *image.config["config"]["Env"]]
    command = [*user, *env, *argv]
    script = " && ".join([*mounts, f"exec chroot {rootfs} {shlex.join(command)}"])
    return subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", script],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_config_is_the_dockerfiles(image: Image) -> None:
    config = image.config["config"]
    assert config["Entrypoint"] == json.loads(instruction("ENTRYPOINT"))
    assert config.get("Cmd") is None  # ENTRYPOINT resets the base image's CMD
    assert config["User"] == instruction("USER") == "65532:65532"
    env = dict(pair.split("=", 1) for pair in config["Env"])
    assert dockerfile_env().items() <= env.items()
    assert "/usr/local/bin" in env["PATH"].split(":")
    exposed = {f"{port}/tcp" for port in instruction("EXPOSE").split()}
    assert set(config["ExposedPorts"]) == exposed == {"8443/tcp", "8081/tcp"}  # metrics, probes
    assert image.config["architecture"] == "amd64"
    assert image.config["os"] == "linux"


def test_named_as_the_charts_default_image(image: Image) -> None:
    chart = yaml.safe_load((ROOT / "charts/headroom/Chart.yaml").read_text())
    values = yaml.safe_load((ROOT / "charts/headroom/values.yaml").read_text())
    assert values["image"]["tag"] == ""  # so the tag is the chart's appVersion
    expected = f"{values['image']['repository']}:{chart['appVersion']}"
    (entry,) = image.index["manifests"]
    assert entry["annotations"]["io.containerd.image.name"] == expected
    assert expected == "ghcr.io/headroom-dev/headroom:0.1.0"


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def wheel_versions(filenames: Iterable[str]) -> set[tuple[str, str]]:
    """(name, version) of each wheel file name (name-version-tags.whl)."""
    return {(canonical(name), version) for name, version, *_ in (f.split("-") for f in filenames)}


def test_same_distributions_as_the_install_recipe(image: Image, tmp_path: Path) -> None:
    # What the Dockerfile's build stage makes from the same context, in a venv.
    context = build_context(tmp_path / "src")
    wheels = tmp_path / "wheels"
    built = run(
        venv(tmp_path / "build"),
        "sh",
        str(ROOT / "hack/image/install.sh"),
        "build",
        str(context),
        str(wheels),
    )
    assert built.returncode == 0, built.stderr[-2000:]
    recipe = wheel_versions(w.name for w in wheels.glob("*.whl"))
    installed = set()
    for dist_info in (image.rootfs / SITE).glob("*.dist-info"):
        metadata = (dist_info / "METADATA").read_text(errors="replace")
        fields = dict(re.findall(r"^(Name|Version): (.+)$", metadata, re.MULTILINE))
        installed.add((canonical(fields["Name"]), fields["Version"]))
    assert ("headroom", "0.1.0") in installed
    # Exactly what the image's own build stage built (recorded by build.sh) ...
    record = image.archive.with_suffix(".wheels")
    assert installed == wheel_versions(record.read_text().split()), record
    # ... and exactly what the recipe makes now: both install requirements/runtime.txt,
    # the lock, so a dependency released since the archive was cached changes neither.
    assert installed == recipe, (
        f"only in the image {sorted(installed - recipe)}, "
        f"only from the recipe {sorted(recipe - installed)}"
    )
    assert ("headroom", "0.1.0") in recipe
    # Nothing of the build stage is left: no wheels, no install script, no sources.
    for leftover in ("wheels", "src", "usr/local/bin/headroom-install"):
        assert not (image.rootfs / leftover).exists(), leftover
    assert not list((image.rootfs / "usr/lib").glob("python3*/EXTERNALLY-MANAGED"))


PROBE = """
import errno, importlib.util as u, json, os, headroom
writable, refused = [], {}
for d in ["/", "/tmp", os.path.dirname(headroom.__file__), os.path.expanduser("~")]:
    try:
        open(os.path.join(d, ".probe"), "w").close()
        writable.append(d)
    except OSError as error:
        refused[d] = errno.errorcode[error.errno]
print(json.dumps({"uid": os.getuid(), "gid": os.getgid(), "groups": os.getgroups(),
                  "headroom": headroom.__file__, "dev": u.find_spec("headroom_dev") is not None,
                  "pytest": u.find_spec("pytest") is not None, "python": os.path.realpath(
                  __import__("shutil").which("python")), "writable": writable, "refused": refused}))
"""


def test_runs_as_its_user_on_a_read_only_root(image: Image, tmp_path: Path) -> None:
    probe = in_image(image, ["python", "-c", PROBE])
    assert probe.returncode == 0, probe.stderr
    seen = json.loads(probe.stdout)
    assert (seen["uid"], seen["gid"], seen["groups"]) == (65532, 65532, [])
    assert seen["headroom"] == f"/{SITE}/headroom/__init__.py"  # the wheel, not the repo
    assert not seen["headroom"].startswith(str(ROOT))
    assert (seen["dev"], seen["pytest"]) == (False, False)
    assert seen["python"] == "/usr/bin/python3.11"  # `python` is python3, as in python:3.11
    assert seen["writable"] == []
    assert seen["refused"]["/tmp"] == "EROFS"  # read-only, not merely not ours

    # As root the same mount refuses too: the root filesystem itself is read-only.
    as_root = in_image(image, ["sh", "-c", "touch /probe"], as_user=False)
    assert as_root.returncode != 0
    assert "Read-only file system" in as_root.stderr

    entrypoint = image.config["config"]["Entrypoint"]
    help_text = in_image(image, [*entrypoint, "--help"])
    assert help_text.returncode == 0, help_text.stderr
    assert "--config" in help_text.stdout

    # The image's HEADROOM_CONFIG names the file the chart mounts; a bad one is refused.
    config_dir = tmp_path / "config"
    config_dir.mkdir()
    (config_dir / "config.yaml").write_text("limits: {systemReserveMb: 5}\n")
    refused = in_image(image, entrypoint, config_dir=config_dir)
    assert refused.returncode == 2, refused.stderr
    assert "limits.systemReserveMb" in refused.stderr
    assert "Traceback" not in refused.stderr


def test_archive_is_cached_and_replaces_older_builds(image: Image) -> None:
    again = subprocess.run(
        ["bash", str(ROOT / "hack/image/build.sh")],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert Path(again.stdout.strip()) == image.archive
    assert "built" not in again.stderr  # reused, not rebuilt
    assert sorted(image.archive.parent.glob("headroom-*.tar")) == [image.archive]
    assert sorted(image.archive.parent.glob("headroom-*.wheels")) == [
        image.archive.with_suffix(".wheels")
    ]
