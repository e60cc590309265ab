"""Run the repository's Dockerfile without a container engine (used by build.sh).

Only the instructions our Dockerfile uses are understood: FROM (the one base
build.sh emulates), WORKDIR, COPY [--from=STAGE], RUN (shell form, as root), ENV,
USER, EXPOSE, ENTRYPOINT, CMD. Anything else fails loudly rather than being
skipped, so the image cannot silently drift from the Dockerfile.

    dockerfile.py stages DOCKERFILE                 one line per stage: INDEX NAME
    dockerfile.py run-stage DOCKERFILE INDEX ROOT CONTEXT EXPORTS
                                                    run stage INDEX's steps in ROOT
                                                    (a chroot), COPY sources from
                                                    CONTEXT, --from files via EXPORTS
    dockerfile.py config DOCKERFILE                 `umoci config` flags of the final
                                                    stage, NUL-separated
    dockerfile.py annotate INDEX_JSON REF           name the image for `ctr images import`
    dockerfile.py inputs DOCKERFILE CONTEXT         the context files the COPYs read
"""

from __future__ import annotations

import fnmatch
import json
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

# The one base image build.sh emulates, and the configuration it passes on
# (python:3.11-slim's PATH and LANG; its CMD is reset by our ENTRYPOINT).
BASE = "python:3.11-slim"
BASE_ENV = {
    "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "LANG": "C.UTF-8",
}
HOST_CA = Path("/etc/ssl/certs/ca-certificates.crt")


class DockerfileError(Exception):
    pass


@dataclass
class Stage:
    index: int
    name: str
    steps: list[tuple[str, str]] = field(default_factory=list)


def logical_lines(text: str) -> list[str]:
    """Instructions with their continuation lines joined and comments dropped."""
    out: list[str] = []
    current = ""
    for raw in text.splitlines():
        line = raw.strip()
        if line.startswith("#"):
            continue  # a comment, also inside a continuation (as Docker does)
        if line.endswith("\\"):
            current += line[:-1] + " "
            continue
        current += line
        if current.strip():
            out.append(current.strip())
        current = ""
    if current.strip():
        out.append(current.strip())
    return out


def parse(path: Path) -> list[Stage]:
    stages: list[Stage] = []
    for line in logical_lines(path.read_text()):
        keyword, _, rest = line.partition(" ")
        keyword, rest = keyword.upper(), rest.strip()
        if keyword == "FROM":
            words = rest.split()
            if words[0] != BASE:
                raise DockerfileError(f"FROM {words[0]}: build.sh only emulates {BASE}")
            name = words[2] if len(words) == 3 and words[1].upper() == "AS" else str(len(stages))
            stages.append(Stage(len(stages), name))
        elif not stages:
            raise DockerfileError(f"{keyword} before the first FROM")
        elif keyword in {"WORKDIR", "COPY", "RUN", "ENV", "USER", "EXPOSE", "ENTRYPOINT", "CMD"}:
            if keyword != "RUN" and "$" in rest:
                raise DockerfileError(f"{keyword} {rest}: variable expansion is not supported")
            stages[-1].steps.append((keyword, rest))
        else:
            raise DockerfileError(f"{keyword}: not supported by build.sh")
    if not stages:
        raise DockerfileError(f"{path}: no FROM")
    return stages


def env_pairs(rest: str) -> list[tuple[str, str]]:
    words = shlex.split(rest)
    if "=" not in words[0]:  # the legacy form: ENV KEY VALUE...
        return [(words[0], rest.split(None, 1)[1])]
    return [(key, value) for key, _, value in (w.partition("=") for w in words)]


def exec_form(rest: str) -> list[str]:
    if rest.startswith("["):
        value = json.loads(rest)
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise DockerfileError(f"not a list of strings: {rest}")
        return value
    return ["/bin/sh", "-c", rest]


def ignored(context: Path) -> list[str]:
    dockerignore = context / ".dockerignore"
    if not dockerignore.exists():
        return []
    lines = (line.strip() for line in dockerignore.read_text().splitlines())
    return [line for line in lines if line and not line.startswith("#")]


def is_ignored(relative: str, patterns: list[str]) -> bool:
    """.dockerignore's common cases: `**/NAME` anywhere, else a glob from the root."""
    parts = relative.split("/")
    for pattern in patterns:
        if pattern.startswith("**/"):
            if any(fnmatch.fnmatchcase(part, pattern[3:]) for part in parts):
                return True
        elif fnmatch.fnmatchcase(relative, pattern.rstrip("/")):
            return True
    return False


def copy(source: Path, target: Path, context: Path | None, patterns: list[str]) -> None:
    """COPY semantics: a directory's contents go into the target directory."""
    if source.is_dir():
        target.mkdir(parents=True, exist_ok=True)
        for child in sorted(source.iterdir()):
            if context is not None and is_ignored(str(child.relative_to(context)), patterns):
                continue
            copy(child, target / child.name, context, patterns)
    elif source.is_symlink() or source.is_file():
        target.parent.mkdir(parents=True, exist_ok=True)
        target.unlink(missing_ok=True)
        shutil.copy2(source, target, follow_symlinks=False)
    else:
        raise DockerfileError(f"COPY: {source} does not exist")


def inputs(dockerfile: Path, context: Path) -> list[Path]:
    """Every context file a COPY reads, after .dockerignore: what the image hashes."""
    patterns = ignored(context)
    found: set[Path] = set()
    for stage in parse(dockerfile):
        for keyword, rest in stage.steps:
            words = rest.split()
            if keyword != "COPY" or words[0].startswith("--from="):
                continue
            for name in words[:-1]:
                source = context / name
                paths = sorted(source.rglob("*")) if source.is_dir() else [source]
                for path in paths:
                    relative = str(path.relative_to(context))
                    if path.is_file() and not any(
                        is_ignored("/".join(relative.split("/")[: n + 1]), patterns)
                        for n in range(relative.count("/") + 1)
                    ):
                        found.add(path)
    return sorted(found)


def inside(root: Path, path: str) -> Path:
    return root / path.lstrip("/")


def run_stage(dockerfile: Path, index: int, root: Path, context: Path, exports: Path) -> None:
    stages = parse(dockerfile)
    stage = stages[index]
    by_name = {s.name: s for s in stages}
    patterns = ignored(context)
    # What python:3.11-slim is and Debian's python3 is not: pip may install system-wide.
    for marker in root.glob("usr/lib/python3*/EXTERNALLY-MANAGED"):
        marker.unlink()
    env = dict(BASE_ENV)
    workdir = "/"
    user: str | None = None
    # A RUN may need the network through this host's TLS interception; the host's CA
    # bundle is lent for the stage's steps and the image's own put back afterwards.
    ca = inside(root, str(HOST_CA))
    saved = ca.read_bytes() if ca.exists() else None
    try:
        if HOST_CA.exists() and ca.parent.is_dir():
            shutil.copy(HOST_CA, ca)
        for keyword, rest in stage.steps:
            if keyword == "WORKDIR":
                workdir = rest if rest.startswith("/") else f"{workdir.rstrip('/')}/{rest}"
                inside(root, workdir).mkdir(parents=True, exist_ok=True)
            elif keyword == "ENV":
                env.update(env_pairs(rest))
            elif keyword == "USER":
                user = rest  # only the image config takes it; a later RUN would be wrong
            elif keyword == "RUN":
                if user is not None:
                    raise DockerfileError(f"RUN after USER {user}: not supported")
                print(f"[stage {stage.name}] RUN {rest}", file=sys.stderr, flush=True)
                argv = ["chroot", str(root), "/usr/bin/env", "-i", "-C", workdir, "HOME=/root"]
                argv += [f"{k}={v}" for k, v in env.items()]
                done = subprocess.run([*argv, "/bin/sh", "-c", rest], check=False)
                if done.returncode != 0:
                    raise DockerfileError(f"stage {stage.name}: RUN {rest}: exit {done.returncode}")
            elif keyword == "COPY":
                words = rest.split()
                source_stage = None
                if words[0].startswith("--from="):
                    source_stage = by_name[words.pop(0).removeprefix("--from=")].name
                elif words[0].startswith("--"):
                    raise DockerfileError(f"COPY {words[0]}: not supported")
                *sources, dest = words
                dest = dest if dest.startswith("/") else f"{workdir.rstrip('/')}/{dest}"
                into_dir = dest.endswith("/") or dest.endswith("/.") or len(sources) > 1
                for name in sources:
                    if source_stage is None:
                        source, base = context / name, context
                    else:
                        source, base = inside(exports / source_stage, name), None
                    target = inside(root, dest)
                    if into_dir and not source.is_dir():
                        target = target / source.name
                    copy(source, target, base, patterns)
    finally:
        if saved is not None:
            ca.write_bytes(saved)
    # What later stages COPY --from this one, kept for them before this root goes.
    for later in stages[index + 1 :]:
        for keyword, rest in later.steps:
            words = rest.split()
            if keyword == "COPY" and words[0] == f"--from={stage.name}":
                for name in words[1:-1]:
                    copy(inside(root, name), inside(exports / stage.name, name), None, [])


def config(dockerfile: Path) -> list[str]:
    final = parse(dockerfile)[-1]
    env = dict(BASE_ENV)
    flags: list[str] = []
    entrypoint: list[str] | None = None
    cmd: list[str] | None = None
    for keyword, rest in final.steps:
        if keyword == "ENV":
            env.update(env_pairs(rest))
        elif keyword == "USER":
            flags += ["--config.user", rest]
        elif keyword == "WORKDIR":
            flags += ["--config.workingdir", rest]
        elif keyword == "EXPOSE":
            for port in rest.split():
                flags += ["--config.exposedports", port if "/" in port else f"{port}/tcp"]
        elif keyword == "ENTRYPOINT":
            entrypoint, cmd = exec_form(rest), None  # ENTRYPOINT resets an inherited CMD
        elif keyword == "CMD":
            cmd = exec_form(rest)
    for key, value in env.items():
        flags += ["--config.env", f"{key}={value}"]
    for word in entrypoint or []:
        flags += ["--config.entrypoint", word]
    for word in cmd or []:
        flags += ["--config.cmd", word]
    return flags


def annotate(index_json: Path, ref: str) -> None:
    index = json.loads(index_json.read_text())
    for manifest in index["manifests"]:
        manifest.setdefault("annotations", {})["io.containerd.image.name"] = ref
    index_json.write_text(json.dumps(index))


def main(argv: list[str]) -> int:
    try:
        match argv:
            case ["stages", dockerfile]:
                stages = parse(Path(dockerfile))
                for stage in stages:
                    print(stage.index, stage.name)
            case ["run-stage", dockerfile, index, root, context, exports]:
                run_stage(Path(dockerfile), int(index), Path(root), Path(context), Path(exports))
            case ["inputs", dockerfile, context]:
                for path in inputs(Path(dockerfile), Path(context)):
                    print(path.relative_to(context))
            case ["config", dockerfile]:
                sys.stdout.write("\0".join(config(Path(dockerfile))) + "\0")
            case ["annotate", index_json, ref]:
                annotate(Path(index_json), ref)
            case _:
                print(__doc__, file=sys.stderr)
                return 2
    except DockerfileError as error:
        print(f"dockerfile.py: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
