"""Cluster catalog: every preset loads, every value names its source, --gpus validation."""
from __future__ import annotations

import dataclasses
import os

import pytest
import yaml

from clusters import CLUSTER_DIR, ClusterSpec, kind_names, load_cluster
from specs.errors import SpecError

KINDS = ["h100-sxm", "h200-sxm", "h800-sxm", "h20", "b200", "b300", "gb200-nvl72", "gb300-nvl72", "a100-sxm-80g", "rtx4090",
         "cpu-local"]
SPEC_FIELDS = {f.name for f in dataclasses.fields(ClusterSpec)} - {"num_devices", "sources"}


def _raw(kind):
    return yaml.safe_load((CLUSTER_DIR / f"{kind}.yaml").read_text())


def test_catalog_has_all_kinds():
    assert set(KINDS) <= set(kind_names())


@pytest.mark.parametrize("kind", KINDS)
def test_preset_fields_exactly_match_clusterspec(kind):
    raw = _raw(kind)
    extra = {"detect_host"} if kind == "cpu-local" else set()
    assert set(raw) == SPEC_FIELDS | extra


@pytest.mark.parametrize("kind", KINDS)
def test_every_value_has_a_source(kind):
    raw = _raw(kind)
    for key, entry in raw.items():
        entries = entry.items() if key == "peak_tflops" else [(None, entry)]
        for sub, e in entries:
            where = f"{kind}.{key}" + (f".{sub}" if sub else "")
            assert isinstance(e, dict) and set(e) == {"value", "source"}, where
            assert isinstance(e["source"], str) and len(e["source"].strip()) >= 3, where
    spec = load_cluster(kind)
    assert set(spec.sources["peak_tflops"]) == set(spec.peak_tflops)
    assert all(spec.sources["peak_tflops"].values())


@pytest.mark.parametrize("kind", KINDS)
def test_preset_loads_with_sane_values(kind):
    c = load_cluster(kind)
    assert c.kind == kind
    assert c.num_devices == c.devices_per_node
    assert c.peak_tflops["bf16"] > 0 and c.hbm_gib > 0 and c.hbm_tbps > 0
    assert c.scaleup_domain >= 1 and c.sm_count >= 1
    if c.fp8:
        assert c.peak_tflops["fp8"] == pytest.approx(2 * c.peak_tflops["bf16"], rel=0.01)
    else:
        assert "fp8" not in c.peak_tflops
    if c.mxfp8:
        # Blackwell: dense fp4 = 2x fp8; Blackwell Ultra (B300/GB300) raised dense NVFP4 to 3x fp8
        assert c.fp8 and c.peak_tflops["fp4"] >= 2 * c.peak_tflops["fp8"] * 0.99
    assert c.is_gpu == (kind != "cpu-local")


def test_known_datasheet_values():
    h100, h800 = load_cluster("h100-sxm"), load_cluster("h800-sxm")
    assert (h100.nvlink_gbps, h800.nvlink_gbps) == (450, 200)  # unidirectional GB/s
    assert h100.peak_tflops["bf16"] == pytest.approx(989, rel=0.01)  # dense, not sparse 1979
    assert load_cluster("h200-sxm").hbm_tbps == 4.8
    b200 = load_cluster("b200")
    assert b200.scaleout_gbps == 400 and b200.mxfp8 and b200.devices_per_node == 8
    a100 = load_cluster("a100-sxm-80g")
    assert not a100.fp8 and a100.peak_tflops["bf16"] == 312 and a100.nvlink_gbps == 300
    rtx = load_cluster("rtx4090")
    assert rtx.nvlink_gbps == 0 and rtx.pcie_gbps > 0 and rtx.fp8 and not rtx.mxfp8


def test_gb200_nvlink_domain_spans_trays():
    c = load_cluster("gb200-nvl72", 72)
    assert c.devices_per_node == 4 and c.num_nodes == 18
    assert c.scaleup_domain == 72 and c.scaleup_size == 72
    assert load_cluster("gb200-nvl72", 144).scaleup_size == 72
    assert load_cluster("h100-sxm", 64).scaleup_size == 8


@pytest.mark.parametrize("gpus", [0, -8])
def test_gpus_must_be_positive(gpus):
    with pytest.raises(SpecError, match="positive"):
        load_cluster("h100-sxm", gpus)


def test_gpus_must_be_whole_nodes():
    with pytest.raises(SpecError, match="whole number"):
        load_cluster("h100-sxm", 12)
    with pytest.raises(SpecError, match="whole number"):
        load_cluster("gb200-nvl72", 6)
    assert load_cluster("h100-sxm", 16).num_nodes == 2
    partial = load_cluster("h100-sxm", 4)  # less than a node is allowed
    assert partial.num_devices == partial.devices_per_node == 4


def test_unknown_kind():
    with pytest.raises(SpecError, match="unknown cluster"):
        load_cluster("tpu-v9")


def test_cpu_local_uses_host_cores():
    cores = len(os.sched_getaffinity(0))
    c = load_cluster("cpu-local")
    assert c.devices_per_node == cores == c.num_devices == c.scaleup_domain
    assert not c.is_gpu and c.nvlink_gbps == 0
    assert "moetune profile" in c.sources["peak_tflops"]["bf16"]
