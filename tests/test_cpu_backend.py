"""The cpu backend: classes from captured /proc/cpuinfo, pins, NUMA domains, session options."""

from __future__ import annotations

import os
import re
import threading
from pathlib import Path

import numpy as np
import pytest

import uform
from uform import Arena, CPUClass, Executor, UnsupportedError
from uform.model import runtime_of
from uform.plugins import cpu
from uform.plugins.sessions.replicas import Replicas, affinity_string, session_options

DATA = Path(__file__).parent / "data" / "cpuinfo"
V2, V3, V4 = CPUClass.X86_64_V2, CPUClass.X86_64_V3, CPUClass.X86_64_V4
VNNI, AMX = CPUClass.X86_64_V4_VNNI_BF16, CPUClass.X86_64_AMX
NEON, SVE = CPUClass.ARM64_NEON, CPUClass.ARM64_SVE

MACHINES = {
    "sandybridge-e5-2670.txt": [V2],
    "skylake-sp-platinum-8175m.txt": [V2, V3, V4],
    "icelake-sp-platinum-8375c.txt": [V2, V3, V4],  # AVX-512 VNNI but no AVX-512 BF16
    "sapphirerapids-platinum-8488c.txt": [V2, V3, V4, VNNI, AMX],
    "zen2-epyc-7r32.txt": [V2, V3],
    "zen3-epyc-7r13.txt": [V2, V3],
    "zen4-epyc-9r14.txt": [V2, V3, V4, VNNI],
    "graviton2-neoverse-n1.txt": [NEON],
    "graviton3-neoverse-v1.txt": [NEON, SVE],
    "apple-m1-asahi.txt": [NEON],
}


@pytest.mark.parametrize("name", sorted(MACHINES))
def test_classes_from_captured_cpuinfo(name: str) -> None:
    assert cpu.classes_from_cpuinfo((DATA / name).read_text()) == MACHINES[name]
    assert cpu.choose_class(None, MACHINES[name]) == MACHINES[name][-1]


def test_every_captured_file_is_tested() -> None:
    assert sorted(p.name for p in DATA.iterdir()) == sorted(MACHINES)


def test_a_class_is_one_every_core_runs() -> None:
    spr = (DATA / "sapphirerapids-platinum-8488c.txt").read_text()
    zen3_core = (DATA / "zen3-epyc-7r13.txt").read_text().split("\n\n")[0]
    assert cpu.classes_from_cpuinfo(spr + "\n" + zen3_core) == [V2, V3]
    assert cpu.classes_from_cpuinfo("") == []


def test_without_cpuinfo_the_architecture_baseline(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import platform

    monkeypatch.delenv("UFORM_CPU_CLASS", raising=False)  # a cap of x86-64's would be refused on arm64
    monkeypatch.setattr(cpu, "CPUINFO", str(tmp_path / "absent"))
    monkeypatch.setattr(platform, "machine", lambda: "arm64")
    assert cpu.machine_classes() == [NEON]
    monkeypatch.setattr(platform, "machine", lambda: "AMD64")
    assert cpu.machine_classes() == [V2]


def test_the_environment_caps_the_classes_a_machine_is_taken_to_run(monkeypatch: pytest.MonkeyPatch) -> None:
    zen4 = MACHINES["zen4-epyc-9r14.txt"]
    assert cpu.capped(zen4, "x86-64-v3") == [V2, V3]
    assert cpu.capped(zen4, " x86-64-v4 ") == [V2, V3, V4]
    assert cpu.capped(zen4, "") == zen4 and cpu.capped(zen4, "  ") == zen4
    assert cpu.capped(MACHINES["zen3-epyc-7r13.txt"], "x86-64-amx") == [V2, V3]  # a cap above the machine changes nothing
    assert cpu.capped(MACHINES["graviton3-neoverse-v1.txt"], "arm64-neon") == [NEON]
    with pytest.raises(UnsupportedError, match=r"^UFORM_CPU_CLASS='avx2' names no CPU class: set it to one of x86-64-v2, x86-64-v3, .*arm64-sve, or unset it$"):
        cpu.capped(zen4, "avx2")
    with pytest.raises(UnsupportedError, match=r"^UFORM_CPU_CLASS=arm64-neon is a class of arm64, and this machine is x86-64: unset it or name one of x86-64-v2, x86-64-v3, x86-64-v4, x86-64-v4\+vnni\+bf16$"):
        cpu.capped(zen4, "arm64-neon")
    monkeypatch.setattr(cpu, "CPUINFO", str(DATA / "sapphirerapids-platinum-8488c.txt"))
    monkeypatch.setenv("UFORM_CPU_CLASS", "x86-64-v4")
    assert cpu.machine_classes() == [V2, V3, V4]
    assert cpu.choose_class(None, cpu.machine_classes()) == V4
    with pytest.raises(UnsupportedError, match=r"^cpu_class x86-64-amx is beyond this machine; the best class it runs is x86-64-v4$"):
        cpu.choose_class(AMX, cpu.machine_classes())
    monkeypatch.delenv("UFORM_CPU_CLASS")
    assert cpu.machine_classes()[-1] == AMX


def test_pin_validation_names_the_class_asked_and_the_best() -> None:
    zen3 = MACHINES["zen3-epyc-7r13.txt"]
    assert cpu.choose_class(V2, zen3) == V2 and cpu.choose_class("x86-64-v3", zen3) == V3
    with pytest.raises(UnsupportedError, match=r"^cpu_class x86-64-amx is beyond this machine; the best class it runs is x86-64-v3$"):
        cpu.choose_class(AMX, zen3)
    with pytest.raises(UnsupportedError, match=r"cpu_class arm64-sve is beyond this machine; this machine is x86-64 and the best class it runs is x86-64-v3"):
        cpu.choose_class(SVE, zen3)
    with pytest.raises(UnsupportedError, match=r"cpu_class arm64-sve is beyond this machine; the best class it runs is arm64-neon"):
        cpu.choose_class(SVE, MACHINES["apple-m1-asahi.txt"])
    with pytest.raises(UnsupportedError, match="reaches no class"):
        cpu.choose_class(None, [])
    with pytest.raises(ValueError, match="cpu_class 'avx9' is not a CPUClass; choose one of x86-64-v2, "):
        cpu.choose_class("avx9", zen3)


def test_load_ram_pins_against_the_machine(tiny_text: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cpu, "CPUINFO", str(DATA / "zen3-epyc-7r13.txt"))
    with pytest.raises(UnsupportedError, match="cpu_class x86-64-v4 is beyond this machine; the best class it runs is x86-64-v3"):
        uform.Model.load_ram(tiny_text, cpu_class=V4)
    assert uform.Model.load_ram(tiny_text, cpu_class=V2).describe().cpu_class == V2
    described = uform.Model.load_ram(tiny_text).describe()
    assert described.cpu_class == V3 and described.gpu_class is None


def test_cpulist_and_affinity_strings() -> None:
    assert cpu.parse_cpulist("0-3,8,10-11\n") == [0, 1, 2, 3, 8, 10, 11]
    assert cpu.parse_cpulist("") == []
    assert affinity_string([2, 0, 1], 3) == "1,2,3;1,2,3"  # ONNX Runtime counts processors from 1
    assert affinity_string([0], 1) == ""


def fake_nodes(root: Path, cpulists: dict[int, str]) -> str:
    for node, cpus in cpulists.items():
        (root / f"node{node}").mkdir(parents=True)
        (root / f"node{node}" / "cpulist").write_text(cpus + "\n")
    (root / "online").write_text("0\n")  # not a node: ignored
    return str(root)


def test_memory_domains_validated_against_nodes(tmp_path: Path) -> None:
    root = fake_nodes(tmp_path, {0: "0-1", 1: "2-3", 3: "4-5"})
    nodes = cpu.numa_nodes(root)
    assert nodes == [0, 1, 3] and cpu.numa_nodes(str(tmp_path / "absent")) == [0]
    assert cpu.check_domains(None, nodes) is None and cpu.check_domains([3, 0], nodes) == [3, 0]
    with pytest.raises(UnsupportedError, match=r"^memory_domains \[0, 2\] name unknown NUMA nodes \[2\]; this machine has NUMA nodes \[0, 1, 3\]$"):
        cpu.check_domains([0, 2], nodes)
    with pytest.raises(UnsupportedError, match=r"memory_domains \[\] is empty; this machine has NUMA nodes \[0, 1, 3\]"):
        cpu.check_domains([], nodes)
    with pytest.raises(ValueError, match=r"memory_domains \[1, 1\] names a node twice"):
        cpu.check_domains([1, 1], nodes)
    with pytest.raises(TypeError, match="memory_domains must be a sequence of NUMA node ids"):
        cpu.check_domains("01", nodes)  # type: ignore[arg-type]


def test_domain_plan_shares_threads_within_allowed_cpus(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = fake_nodes(tmp_path, {0: "0-3", 1: "4-7", 2: ""})
    monkeypatch.setattr(cpu, "allowed_cpus", lambda: {0, 1, 2, 3, 4, 5})
    assert cpu.domain_plan(None, 8, root) == [(None, 8)]
    assert cpu.domain_plan([0, 1], 8, root) == [([0, 1, 2, 3], 4), ([4, 5], 2)]
    assert cpu.domain_plan([1], 1, root) == [([4, 5], 1)]
    with pytest.raises(UnsupportedError, match=r"NUMA node 2 has no CPU this process may run on \(allowed: \[0, 1, 2, 3, 4, 5\]\)"):
        cpu.domain_plan([2], 8, root)


def test_session_options_come_from_the_executor() -> None:
    so = session_options(3, [0, 1])
    assert so.intra_op_num_threads == 3 and so.inter_op_num_threads == 1
    assert so.get_session_config_entry("session.intra_op.allow_spinning") == "0"
    assert so.get_session_config_entry("session.inter_op.allow_spinning") == "0"
    assert so.get_session_config_entry("session.intra_op_thread_affinities") == "1,2;1,2"


@pytest.mark.parametrize("quantization", [uform.Scalar.F32, uform.Scalar.BF16])  # the cpu backend, and the e4m3 one where it serves
def test_load_ram_sessions_use_the_executor_threads(tiny_text: Path, quantization: uform.Scalar) -> None:
    model = uform.Model.load_ram(tiny_text, executor=Executor(threads=1), quantization=quantization)
    runner = runtime_of(model).placement.runners["text"]
    session = runner.session if model.backend == "e4m3" else runner  # type: ignore[attr-defined]
    assert session.get_session_options().intra_op_num_threads == 1


TEXTS = [("text %d " % i) * (i % 5) for i in range(80)]


def test_one_memory_domain_matches_the_plain_load(tiny_text: Path, tiny_model: uform.Model) -> None:
    nodes = cpu.numa_nodes()
    pinned = uform.Model.load_ram(tiny_text, memory_domains=[nodes[0]])
    want = np.array(tiny_model.text_encode(TEXTS, Arena()).embeddings)
    assert np.array_equal(np.array(pinned.text_encode(TEXTS, Arena()).embeddings), want)
    assert pinned.describe().memory_usage == tiny_model.describe().memory_usage
    with pytest.raises(UnsupportedError, match=re.escape(f"name unknown NUMA nodes [99]; this machine has NUMA nodes {nodes}")):
        uform.Model.load_ram(tiny_text, memory_domains=[99])


def test_two_domains_make_two_pinned_replicas(tmp_path: Path, tiny_text: Path, tiny_model: uform.Model, monkeypatch: pytest.MonkeyPatch) -> None:
    allowed = sorted(os.sched_getaffinity(0))
    first, last = allowed[0], allowed[-1]
    monkeypatch.setattr(cpu, "NODE_ROOT", fake_nodes(tmp_path / "nodes", {0: str(first), 1: str(last)}))
    model = uform.Model.load_ram(tiny_text, memory_domains=[0, 1], executor=Executor(threads=2))
    runner = runtime_of(model).placement.runners["text"]
    assert isinstance(runner, Replicas) and runner.affinities == [[first], [last]]
    assert model.describe().memory_usage == 2 * tiny_model.describe().memory_usage
    assert (runtime_of(model).placement.batch_scale, runtime_of(tiny_model).placement.batch_scale) == (2, 1)
    want = np.array(tiny_model.text_encode(TEXTS, Arena()).embeddings)
    np.testing.assert_allclose(np.array(model.text_encode(TEXTS, Arena()).embeddings), want, rtol=1e-6, atol=1e-7)
    assert min(runner.calls) > 0  # both domains served the call


def test_pinned_replicas_run_on_their_cpus() -> None:
    allowed = sorted(os.sched_getaffinity(0))
    seen: list[tuple[int, set[int], str]] = []

    class Probe:
        def __init__(self, i: int) -> None:
            self.i = i

        def run(self, names: object, feed: dict[str, np.ndarray]) -> list[np.ndarray]:
            seen.append((self.i, os.sched_getaffinity(0), threading.current_thread().name))
            return [feed["x"] + self.i]

    replicas = Replicas([Probe(0), Probe(1)], [[allowed[0]], [allowed[-1]]], min_rows=2)
    out = replicas.run(None, {"x": np.zeros((4, 1), np.float32)})[0]
    assert out[:, 0].tolist() == [0, 0, 1, 1]
    assert sorted((i, tuple(cpus)) for i, cpus, _ in seen) == [(0, (allowed[0],)), (1, (allowed[-1],))]
    assert all(name.startswith("uform-replica") for _, _, name in seen)
    assert os.sched_getaffinity(0) == set(allowed)  # the caller's own affinity is left alone
    replicas.close()
