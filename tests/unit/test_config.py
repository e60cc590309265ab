"""The config file: defaults, exact values, and errors that name the field and value."""

from __future__ import annotations

from datetime import timedelta
from fractions import Fraction

import pytest

from headroom.api.config import ConfigError, parse_config
from headroom.api.constants import DEFAULT_DRA_DRIVERS, MAX_DRA_DRIVERS
from headroom.api.gpus import GpuPolicy
from headroom.api.parse import parse_duration


def test_empty_file_means_documented_defaults() -> None:
    config = parse_config("")
    assert config.limits.max_overcommit_ratio == 1
    assert config.limits.system_reserve_mb == 1024
    assert config.limits.heartbeat_stale_window == timedelta(minutes=5)
    assert config.ram_source == "allocatable"
    assert config.leader_election.enabled is False


def test_values_are_read_exactly() -> None:
    config = parse_config("limits: {maxOvercommitRatio: 1.1, heartbeatStaleWindow: 1h30m}")
    assert config.limits.max_overcommit_ratio == Fraction(11, 10)
    assert config.limits.heartbeat_stale_window == timedelta(minutes=90)


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("limits: {maxOvercommitRatio: -1}", "limits.maxOvercommitRatio"),
        ("limits: {systemReserveMb: 5}", "limits.systemReserveMb"),
        ("limits: {maxEntriesPerNode: 0}", "limits.maxEntriesPerNode"),
        ("sweepPeriod: soon", "sweepPeriod"),
        ("ramSource: swap", "ramSource"),
        ("metricsPort: 70000", "metricsPort"),
        (
            "leaderElection: {enabled: true, leaseDuration: 5s, renewDeadline: 10s}",
            "leaderElection",
        ),
        # issue 14: values that once passed and then overflowed or spun
        ("limits: {systemReserveMB: 2000000000}", "limits.systemReserveMB"),
        ("limits: {maxOvercommitRatio: '1e20000000'}", "limits.maxOvercommitRatio"),
        ("limits: {heartbeatStaleWindow: 99999999999h}", "limits.heartbeatStaleWindow"),
        ("summaryInterval: 0.0001ms", "summaryInterval"),
        ("metricsPort: '8080'", "metricsPort"),
        ("limits: {maxEntriesPerNode: 1e3}", "limits.maxEntriesPerNode"),
        ("decisionKey: {enabled: 'yes'}", "decisionKey.enabled"),
        ("[1, 2]", "mapping"),
        ("limits: [", "YAML"),
    ],
)
def test_bad_config_names_the_field(text: str, named: str) -> None:
    with pytest.raises(ConfigError, match=r"f\.yaml") as error:
        parse_config(text, "f.yaml")
    assert named in str(error.value)


@pytest.mark.parametrize(
    ("raw", "seconds"), [("90s", 90), ("5m", 300), ("1h30m", 5400), ("250ms", 0.25), (7, 7)]
)
def test_durations(raw: object, seconds: float) -> None:
    assert parse_duration(raw).total_seconds() == seconds


@pytest.mark.parametrize("raw", ["", "5", "5d", "-1s", 0, True, "1h 30m"])
def test_bad_durations(raw: object) -> None:
    with pytest.raises(ValueError, match="duration"):
        parse_duration(raw)


def test_the_webhook_is_off_by_default_and_its_certificate_settings_are_checked() -> None:
    webhook = parse_config("").webhook
    assert webhook.enabled is False
    assert webhook.port == 9443
    assert webhook.certificate.secret_name == "headroom-webhook-cert"
    assert webhook.certificate.validity == timedelta(days=90)
    assert webhook.certificate.ca_validity == timedelta(days=365)
    assert webhook.drain_delay == timedelta(0)  # a local process has no endpoint to leave
    on = parse_config("webhook: {enabled: true, certificate: {extraNames: [127.0.0.1]}}")
    assert on.webhook.certificate.extra_names == ["127.0.0.1"]
    assert parse_config("webhook: {drainDelay: 5s}").webhook.drain_delay == timedelta(seconds=5)
    for text, named in [
        ("webhook: {port: 70000}", "webhook.port"),
        ("webhook: {tls: {}}", "webhook.tls"),
        ("webhook: {certificate: {secretname: x}}", "webhook.certificate.secretname"),
        ("webhook: {certificate: {validity: 400d}}", "webhook.certificate.validity"),
        ("webhook: {certificate: {validity: 2h, caValidity: 1h}}", "webhook.certificate"),
        ("webhook: {drainDelay: 6m}", "webhook.drainDelay"),
        ("webhook: {drainDelay: -1s}", "webhook.drainDelay"),
    ]:
        with pytest.raises(ConfigError) as error:
            parse_config(text, "f.yaml")
        assert named in str(error.value), text


def test_gpu_settings_default_and_are_read() -> None:
    config = parse_config("")
    assert config.limits.max_vram_overcommit_ratio == 1
    assert config.limits.gpu_policy == GpuPolicy.BINPACK
    assert config.gpus.dra_drivers == DEFAULT_DRA_DRIVERS == ("gpu.nvidia.com",)
    limits = config.limits.to_limits()
    assert (limits.max_vram_overcommit_ratio, limits.gpu_policy) == (1, GpuPolicy.BINPACK)

    config = parse_config(
        "limits: {maxVramOvercommitRatio: '1.25', gpuPolicy: spread}\n"
        "gpus: {draDrivers: [gpu.nvidia.com, gpu.example.org]}"
    )
    limits = config.limits.to_limits()
    assert limits.max_vram_overcommit_ratio == Fraction(5, 4)
    assert limits.gpu_policy == GpuPolicy.SPREAD
    assert config.gpus.dra_drivers == ("gpu.nvidia.com", "gpu.example.org")
    assert parse_config("gpus: {draDrivers: []}").gpus.dra_drivers == ()
    assert parse_config("limits: {maxVramOvercommitRatio: 0}").limits.max_vram_overcommit_ratio == 0


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("limits: {maxVramOvercommitRatio: -1}", "limits.maxVramOvercommitRatio"),
        ("limits: {maxVramOvercommitRatio: lots}", "limits.maxVramOvercommitRatio"),
        ("limits: {maxVramOvercommitRatio: 101}", "limits.maxVramOvercommitRatio"),
        ("limits: {gpuPolicy: pack}", "limits.gpuPolicy"),
        ("limits: {gpuPolicy: 1}", "limits.gpuPolicy"),
        ("gpus: {draDrivers: gpu.nvidia.com}", "gpus.draDrivers"),
        ("gpus: {draDrivers: [GPU_NVIDIA]}", "gpus.draDrivers.0"),
        ("gpus: {draDrivers: ['']}", "gpus.draDrivers.0"),
        (f"gpus: {{draDrivers: [{'a' * 254}]}}", "gpus.draDrivers.0"),
        (f"gpus: {{draDrivers: [{', '.join(['d'] * (MAX_DRA_DRIVERS + 1))}]}}", "gpus.draDrivers"),
        ("gpus: {drivers: [gpu.nvidia.com]}", "gpus.drivers"),
    ],
)
def test_bad_gpu_settings_name_the_field(text: str, named: str) -> None:
    with pytest.raises(ConfigError, match=r"f\.yaml") as error:
        parse_config(text, "f.yaml")
    assert named in str(error.value)


def test_metrics_are_secure_by_default_and_probes_apart() -> None:
    config = parse_config("")
    assert (config.probe_port, config.metrics_port) == (8081, 8443)
    assert config.metrics_secure is True
    assert config.metrics_cert_dir is None
    plain = parse_config("metricsSecure: false\nmetricsPort: 8080")
    assert (plain.metrics_secure, plain.metrics_port) == (False, 8080)
    with pytest.raises(ConfigError, match="probePort and metricsPort are both 9000"):
        parse_config("probePort: 9000\nmetricsPort: 9000")
    with pytest.raises(ConfigError, match="metricsSecure"):
        parse_config("metricsSecure: 'no'")


def test_placement_is_by_gate_unless_the_scheduler_mode_names_its_extender() -> None:
    default = parse_config("", "f.yaml").placement
    assert (default.mode, default.scheduler_name) == ("gate", "headroom")
    config = parse_config("placement: {mode: scheduler}\nextenderPort: 9444\n", "f.yaml")
    assert config.placement.mode == "scheduler"
    with pytest.raises(ConfigError, match=r"placement\.mode: scheduler needs extenderPort"):
        parse_config("placement: {mode: scheduler}\n", "f.yaml")
    with pytest.raises(ConfigError, match=r"placement\.mode"):
        parse_config("placement: {mode: both}\n", "f.yaml")


def test_the_extender_serves_https_to_client_certificates_only_beside_the_webhook() -> None:
    assert parse_config("extenderPort: 9444\n", "f.yaml").extender_client_secret is None
    config = parse_config(
        "extenderPort: 9444\nextenderClientSecret: sched-client\nwebhook: {enabled: true}\n",
        "f.yaml",
    )
    assert config.extender_client_secret == "sched-client"
    with pytest.raises(ConfigError, match=r"extenderClientSecret 'sched-client' needs"):
        parse_config("extenderPort: 9444\nextenderClientSecret: sched-client\n", "f.yaml")
    with pytest.raises(ConfigError, match=r"extenderClientSecret 'c' needs extenderPort"):
        parse_config("extenderClientSecret: c\nwebhook: {enabled: true}\n", "f.yaml")
    with pytest.raises(ConfigError, match=r"extenderSchedulerDeployment 'd' needs"):
        parse_config("extenderPort: 9444\nextenderSchedulerDeployment: d\n", "f.yaml")
    with pytest.raises(ConfigError, match=r"'headroom-webhook-cert' is the webhook's"):
        parse_config(
            "extenderPort: 9444\nextenderClientSecret: headroom-webhook-cert\n"
            "webhook: {enabled: true}\n",
            "f.yaml",
        )
