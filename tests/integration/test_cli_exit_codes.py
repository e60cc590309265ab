"""`kubectl headroom` exit codes, each produced for real (docs/reference/cli.md):
0 done, 1 refused, 2 bad argument (nothing sent), 3 no decision in time, 4 the
cluster unreachable or refusing. Every failure is one line on stderr, no traceback.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from kubernetes import client

from headroom_dev import reservations as rsv
from headroom_dev.certs import CertificateAuthority
from headroom_dev.controlplane import ControlPlane, free_port
from tests.integration.cli_checks import Cli, assert_one_line_error, kubeconfig_like_admin

BAD_ARGUMENTS = [
    ({"--timeout": "0"}, ["--timeout", "'0'"]),
    ({"--timeout": "0s"}, ["--timeout", "'0s'", "outside 1ms"]),
    ({"--ttl": "-1h"}, ["--ttl", "'-1h'"]),
    ({"--ram": "-5"}, ["--ram: Invalid value: -5: should be greater than or equal to 0"]),
    ({"--ram": "1073741825"}, ["--ram", "should be less than or equal to 1073741824"]),
    ({"--ram": "0"}, ["at least one of --ram and --vram must be above 0"]),
    ({"--ram": "1.5"}, ["--ram", '"1.5"']),
    ({"--node": "UPPER"}, ['--node: Invalid value: "UPPER": a lowercase RFC 1123 subdomain']),
    ({"--node": "n" * 254}, ["--node: Too long: may not be more than 253"]),
    ({"--name": "Bad_Name"}, ['--name: Invalid value: "Bad_Name"']),
    ({"--owner-pod": "-pod"}, ['--owner-pod: Invalid value: "-pod"']),
    ({"--wait-for-room": "25h"}, ['--wait-for-room: Invalid value: "25h": must be at most 24h']),
    ({"--wait-for-room": "-1m"}, ['--wait-for-room: Invalid value: "-1m"', "should match"]),
]


@pytest.mark.parametrize(
    ("bad", "message"),
    BAD_ARGUMENTS,
    ids=[" ".join(next(iter(bad.items())))[:24] for bad, _ in BAD_ARGUMENTS],
)
def test_a_bad_argument_exits_2_and_sends_nothing(
    cli: Cli,
    control_plane: ControlPlane,
    custom: client.CustomObjectsApi,
    namespace: str,
    crds: list[str],
    tmp_path: Path,
    bad: dict[str, str],
    message: list[str],
) -> None:
    flags = {"--node": "some-node", "--ram": "64", "--name": "bad-args", **bad}
    argv = ["reserve", *[word for pair in flags.items() for word in pair], "--wait"]
    result = cli(*argv)
    assert result.returncode == 2, result.stdout + result.stderr
    assert_one_line_error(result, *message)
    assert rsv.list_all(custom, namespace) == []
    # Checked before connecting: an unreachable cluster changes nothing.
    closed = kubeconfig_like_admin(
        control_plane, tmp_path / "closed.kubeconfig", server=f"https://127.0.0.1:{free_port()}"
    )
    assert cli(*argv, kubeconfig=closed).returncode == 2


@pytest.mark.parametrize(
    "command",
    [
        ["nodes"],
        ["summary"],
        ["why", "some"],
        ["heartbeat", "some"],
        ["reserve", "--node", "n", "--ram", "1", "--wait"],
        ["reserve", "--node", "auto", "--ram", "1"],
        ["fit", "--ram", "1"],
    ],
)
def test_an_unreachable_api_server_exits_4_with_one_line(
    cli: Cli, control_plane: ControlPlane, tmp_path: Path, command: list[str]
) -> None:
    port = free_port()  # free now, and nothing listens on it
    closed = kubeconfig_like_admin(
        control_plane, tmp_path / "closed.kubeconfig", server=f"https://127.0.0.1:{port}"
    )
    result = cli(*command, kubeconfig=closed)
    assert result.returncode == 4, result.stderr
    assert_one_line_error(
        result, f"cannot reach the API server at https://127.0.0.1:{port}", "Connection refused"
    )


def test_untrusted_server_and_unknown_client_exit_4(
    cli: Cli, control_plane: ControlPlane, tmp_path: Path, crds: list[str]
) -> None:
    stranger = CertificateAuthority("stranger-ca")
    (tmp_path / "stranger-ca.crt").write_bytes(stranger.cert_pem)
    untrusted = kubeconfig_like_admin(
        control_plane,
        tmp_path / "untrusted.kubeconfig",
        **{"certificate-authority": str(tmp_path / "stranger-ca.crt")},
    )
    result = cli("nodes", kubeconfig=untrusted)
    assert result.returncode == 4, result.stderr
    assert_one_line_error(result, "cannot reach the API server", "CERTIFICATE_VERIFY_FAILED")

    cert, key = stranger.client("mallory").write(tmp_path, "mallory")
    unknown = kubeconfig_like_admin(
        control_plane,
        tmp_path / "unknown.kubeconfig",
        **{"client-certificate": str(cert), "client-key": str(key)},
    )
    result = cli("nodes", kubeconfig=unknown)
    assert result.returncode == 4, result.stderr
    assert_one_line_error(result, "401 Unauthorized")


def test_wait_timeout_exits_3_and_deletes_what_it_created(
    cli: Cli, custom: client.CustomObjectsApi, namespace: str, crds: list[str]
) -> None:
    """No operator runs: nothing decides."""
    result = cli(
        "reserve", "--node", "n", "--ram", "64", "--name", "late", "--wait", "--timeout", "2s"
    )
    assert result.returncode == 3, result.stdout + result.stderr
    assert_one_line_error(
        result, f"no decision on reservation {namespace}/late within 2s", "deleted it"
    )
    assert rsv.list_all(custom, namespace) == []
    again = cli(
        "reserve", "--node", "n", "--ram", "64", "--name", "late", "--wait", "--timeout", "1s"
    )
    assert again.returncode == 3, again.stderr  # not 409: the first one is gone


def test_wait_timeout_keeps_it_when_asked(
    cli: Cli, custom: client.CustomObjectsApi, namespace: str, crds: list[str]
) -> None:
    result = cli(
        "reserve", "--node", "n", "--ram", "64", "--name", "kept", "--wait", "--timeout", "1s",
        "--keep-on-timeout",
    )  # fmt: skip
    assert result.returncode == 3, result.stdout + result.stderr
    assert_one_line_error(
        result, "kept it (--keep-on-timeout)", f"kubectl delete rsv kept -n {namespace}"
    )
    kept = rsv.list_all(custom, namespace)
    assert [(i["metadata"]["name"], i.get("status")) for i in kept] == [("kept", None)]

    beat = cli("heartbeat", "kept")  # undecided: recorded, not refused
    assert beat.returncode == 0, beat.stderr
    assert "not decided yet: Pending; the heartbeat is recorded" in beat.stdout
    annotations = rsv.get(custom, namespace, "kept")["metadata"]["annotations"]
    assert "headroom.dev/heartbeat" in annotations

    same_again = cli("reserve", "--node", "n", "--ram", "64", "--name", "kept")
    assert same_again.returncode == 4  # 409 from the API server
    assert_one_line_error(same_again, "409", 'reservations.headroom.dev "kept" already exists')


def test_a_missing_reservation_exits_4(cli: Cli, namespace: str, crds: list[str]) -> None:
    for command in ("why", "heartbeat"):
        result = cli(command, "nope")
        assert result.returncode == 4, result.stderr
        assert_one_line_error(result, f'reservation "nope" not found in namespace "{namespace}"')


def test_reserve_without_wait_exits_0(
    cli: Cli, custom: client.CustomObjectsApi, namespace: str, crds: list[str]
) -> None:
    result = cli("reserve", "--node", "n", "--ram", "0", "--vram", "512", "-o", "json")
    assert result.returncode == 0, result.stderr
    created = rsv.list_all(custom, namespace)
    assert len(created) == 1
    assert created[0]["metadata"]["name"].startswith("rsv-")
    assert created[0]["spec"] == {"node": "n", "ramMB": 0, "vramMB": 512}
