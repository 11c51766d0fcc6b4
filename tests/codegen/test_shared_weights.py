"""Constants several nodes load whole share one SBUF home (docs/memory_planner.md#shared-weights):
the clones of a conv that a batch runs an image at a time read its weights from DRAM once."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import assert_matches_onnxruntime, make_model
from onnx import helper

from onnx2bir.bir.enums import Opcode
from onnx2bir.codegen.arena import Arena
from onnx2bir.codegen.planner import WeightRequest, _place_weight_homes
from onnx2bir.compiler import compile_graph, import_graph
from onnx2bir.errors import MachineError
from onnx2bir.options import CompileOptions
from onnx2bir.patterns import batch_split

BATCH, C_IN, C_MID = 3, 8, 16


def _w(seed: int, *shape: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(shape) / np.sqrt(np.prod(shape[1:]))).astype(np.float32)


def _net(c_mid: int = C_MID, size: int = 16):
    """Conv(bias) -> Relu -> Conv -> GlobalAveragePool -> Flatten -> Gemm at batch 3; under
    `small_spill` the front runs an image at a time, so each conv has three clones."""
    nodes = [
        helper.make_node("Conv", ["x", "w0", "b0"], ["c0"], name="c0", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c0"], ["r0"], name="r0"),
        helper.make_node("Conv", ["r0", "w1"], ["c1"], name="c1", pads=[1, 1, 1, 1]),
        helper.make_node("GlobalAveragePool", ["c1"], ["g"], name="gap"),
        helper.make_node("Flatten", ["g"], ["f"], name="flatten"),
        helper.make_node("Gemm", ["f", "wf"], ["y"], name="fc", transB=1),
    ]
    inits = {
        "w0": _w(1, c_mid, C_IN, 3, 3),
        "b0": _w(2, c_mid, 1)[:, 0],
        "w1": _w(3, c_mid, c_mid, 3, 3),
        "wf": _w(4, 10, c_mid),
    }
    return make_model(nodes, {"x": (BATCH, C_IN, size, size)}, {"y": None}, initializers=inits)


@pytest.fixture
def small_spill(monkeypatch):
    """Count a 16-channel 16 x 16 activation of the whole batch (48 KiB) as going through
    DRAM and one image's as staying on chip."""
    monkeypatch.setattr(batch_split, "SPILL_BYTES", 20 * 1024)


def _compiled():
    return compile_graph(import_graph(_net()), CompileOptions(auto_cast="none"))


def _dma_reads(function, location: str) -> list:
    return [
        ins
        for ins in function.instructions()
        if ins.opcode is Opcode.DMA_COPY and ins.srcs["in"].loc == location
    ]


def test_the_clones_of_a_conv_read_its_weights_from_dram_once(small_spill):
    compiled = _compiled()
    function = compiled.module.functions[0]
    clones = [name for name, _ in compiled.graph.nodes() if name.startswith("c1/image")]
    assert len(clones) == BATCH
    # a conv kernel may read its weights in another layout, a constant derived from w1
    homes = {home.key[0].split("@")[0]: home for home in compiled.memory_plan.weight_homes}
    assert {"w0", "b0", "w1"} <= set(homes)
    home = homes["w1"]
    assert len(home.items) == BATCH
    # only the first clone loads w1, and every byte of it (fp32: no autocast) once, counted
    # from the model's shape
    reads = _dma_reads(function, home.key[0])
    assert {ins.origin.node for ins in reads} == {"c1/image0"}
    moved = sum(ins.dst.num_elements * 4 for ins in reads)
    assert moved == C_MID * C_MID * 9 * 4
    # the other clones' matmuls read the home the first one loaded
    stationary = {
        ins.srcs["stationary"].loc
        for ins in function.instructions()
        if ins.opcode is Opcode.MATMULT and ins.origin.node.startswith("c1/")
    }
    assert stationary == {home.name}


def test_the_shared_weights_program_matches_onnxruntime(small_spill):
    assert _compiled().memory_plan.weight_homes
    assert_matches_onnxruntime(_net())


def test_a_conv_kernel_holds_several_output_tiles_whole_to_share_them(monkeypatch):
    """w0 (8 -> 160 channels) takes the rep_nhwc kernel with two C_out tiles; its weights
    and bias are held whole, one slot per tile, so the clones share them too. An image's
    160-channel 8 x 8 activations (40 KiB) count as on chip, the batch's as through DRAM."""
    monkeypatch.setattr(batch_split, "SPILL_BYTES", 64 * 1024)
    model = _net(c_mid=160, size=8)
    compiled = compile_graph(import_graph(model), CompileOptions(auto_cast="none"))
    function = compiled.module.functions[0]
    homes = {home.key[0].split("@")[0]: home for home in compiled.memory_plan.weight_homes}
    assert len(homes["w0"].items) == len(homes["b0"].items) == BATCH
    assert all(
        ins.origin.rule.startswith("kernel.Conv2d_dw_fb01_io01_01bf_rep_nhwc")
        for ins in _dma_reads(function, homes["w0"].key[0])
    )
    moved = sum(ins.dst.num_elements * 4 for ins in _dma_reads(function, homes["w0"].key[0]))
    assert moved == 160 * C_IN * 9 * 4
    assert sum(ins.dst.num_elements * 4 for ins in _dma_reads(function, "b0")) == 160 * 4
    assert_matches_onnxruntime(model)


def test_a_home_its_first_reader_does_not_load_is_caught(small_spill, monkeypatch):
    """Had the first clone skipped its load, the others would read bytes never written."""
    weight_tile = Arena.weight_tile

    def never_load(self, *args, **kwargs):
        tile, load = weight_tile(self, *args, **kwargs)
        homes = self.plan.weight_homes if self.plan else []
        return tile, load and tile.name not in {home.name for home in homes}

    monkeypatch.setattr(Arena, "weight_tile", never_load)
    with pytest.raises(MachineError, match="that nothing wrote"):
        assert_matches_onnxruntime(_net())


def test_without_the_split_nothing_is_shared():
    """At batch 3 with the real spill threshold the front is not cloned: each weight has one
    reader, and no home is made for it."""
    compiled = _compiled()
    assert not [name for name, _ in compiled.graph.nodes() if "/image" in name]
    assert compiled.memory_plan.weight_homes == []


def _request(item: int, key: str = "w", nbytes: int = 1024) -> WeightRequest:
    return WeightRequest(item, (key,), 128, nbytes)


def test_readers_are_cut_into_runs_where_the_room_runs_out():
    """A tensor home takes every byte under the arenas at items 6-7: the reader at item 9
    cannot share the home of the readers at 1, 3 and 5, and being alone it loads its own."""
    top = 192 * 1024
    placed = [(6, 7, 0, top)]
    homes, refused = _place_weight_homes(
        [_request(i) for i in (1, 3, 5, 9)], placed, {}, reserved=0
    )
    assert [home.items for home in homes] == [(1, 3, 5)]
    assert "does not fit" in refused[("w",)] and "entry item 1 to 9" in refused[("w",)]


def test_a_home_stays_under_the_arenas_and_apart_from_live_homes():
    top = 192 * 1024
    arenas = {2: top - 4096}  # item 2's arena leaves 4 KiB under it
    placed = [(0, 4, 0, 2048)]  # a tensor home on the first 2 KiB
    homes, _ = _place_weight_homes([_request(i, nbytes=2048) for i in (1, 3)], placed, arenas, 0)
    assert [(home.address, home.nbytes) for home in homes] == [(2048, 2048)]
    homes, refused = _place_weight_homes(
        [_request(i, nbytes=2560) for i in (1, 3)], placed, arenas, 0
    )
    assert homes == [] and "needs 2560 B" in refused[("w",)]


def test_the_largest_saving_is_placed_first():
    """Room for one of two: the weight read by three nodes wins over the one read by two."""
    top = 192 * 1024
    arenas = {item: top - 4096 for item in range(6)}
    requests = [_request(i, "two", 4096) for i in (0, 5)]
    requests += [_request(i, "three", 4096) for i in (1, 2, 4)]
    homes, refused = _place_weight_homes(requests, [], arenas, 0)
    assert [home.key for home in homes] == [("three",)]
    assert ("two",) in refused


def test_report_lists_the_shared_weights(small_spill):
    import onnx2bir
    from onnx2bir.reporting.memory import memory_text

    memory = onnx2bir.report(_net()).to_json()["memory"]
    shared = {record["constant"].split("@")[0]: record for record in memory["shared_weights"]}
    assert shared["w1"]["readers"] == BATCH
    assert shared["w1"]["first_item"] < shared["w1"]["last_item"]
    assert memory["shared_weights_refused"] == []
    assert any("weights shared in SBUF" in line for line in memory_text(memory))
