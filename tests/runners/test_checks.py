"""The tolerance rule and the output checks the parent applies."""

from __future__ import annotations

import torch

from runners import checks
from runners.checks import Reason


def test_it_scales_atol_by_the_rms_of_each_row():
    ref = torch.tensor([[64.0, -64.0, 0.01], [0.001, -0.001, 0.0]], dtype=torch.float64)
    out = ref.clone()
    out[0, 2] += 0.004  # tiny next to the row's RMS of ~52
    assert checks.compare_tensors(out, ref, atol=1e-4, rtol=1e-4).passed
    out = ref.clone()
    out[1, 2] += 0.004  # larger than that row's whole scale
    assert not checks.compare_tensors(out, ref, atol=1e-4, rtol=1e-4).passed


def test_it_flags_nonfinite_outputs_and_all_zero_outputs():
    ref = torch.randn(4, 8, dtype=torch.float64)
    out = ref.float().clone()
    out[1, 1] = float("nan")
    result = checks.compare_tensors(out, ref, atol=1e-4, rtol=1e-4)
    assert result.nonfinite and not result.passed
    zeros = checks.compare_tensors(torch.zeros(4, 8), ref, atol=1e-4, rtol=1e-4)
    assert zeros.all_zero and not zeros.passed


def test_it_requires_matching_infinities_where_the_reference_has_them():
    ref = torch.tensor([[1.0, float("inf")]], dtype=torch.float64)
    assert checks.compare_tensors(torch.tensor([[1.0, float("inf")]]), ref, atol=0, rtol=1e-6).passed
    assert not checks.compare_tensors(torch.tensor([[1.0, 5.0]]), ref, atol=0, rtol=1e-6).passed


def test_it_leaves_masked_elements_out():
    ref = torch.ones(2, 3, dtype=torch.float64)
    out = ref.clone()
    out[1] = 99.0
    mask = torch.tensor([[True] * 3, [False] * 3])
    assert checks.compare_tensors(out, ref, atol=1e-4, rtol=1e-4, mask=mask).passed
    assert not checks.compare_tensors(out, ref, atol=1e-4, rtol=1e-4).passed


def test_it_names_the_phase_in_timed_and_revalidation_failures():
    ref = (torch.ones(2, 2, dtype=torch.float64),)
    judged = checks.judge_outputs((torch.zeros(2, 2),), ref, (None,), atol=1e-4, rtol=1e-4, where="timed call 3", failure_code="correctness.timed_output_mismatch")
    assert {r.code for r in judged.reasons} == {"correctness.all_zero", "correctness.timed_output_mismatch"}
    wrong = checks.judge_outputs((torch.full((2, 2), 2.0),), ref, (None,), atol=1e-4, rtol=1e-4, where="check")
    assert [r.code for r in wrong.reasons] == ["correctness.mismatch"] and wrong.max_abs_err == 1.0


def test_it_checks_output_descriptions_for_type_shape_dtype_device_and_aliasing():
    good = {"exact_tensor": True, "shape": [2, 3], "dtype": "float32", "device_type": "cpu", "aliases_input": False}
    assert checks.check_output_meta([good], expected_shapes=[(2, 3)], dtype="float32", device_type="cpu", where="w") == []
    cases = {
        "correctness.output_type": {"exact_tensor": False, "type": "Lazy"},
        "correctness.shape": {**good, "shape": [3, 2]},
        "correctness.dtype": {**good, "dtype": "float64"},
        "correctness.device": {**good, "device_type": "cuda"},
        "integrity.output_aliases_input": {**good, "aliases_input": True},
    }
    for code, meta in cases.items():
        reasons = checks.check_output_meta([meta], expected_shapes=[(2, 3)], dtype="float32", device_type="cpu", where="w")
        assert [r.code for r in reasons] == [code]
    assert checks.check_output_meta(None, expected_shapes=[(2, 3)], dtype="float32", device_type="cpu", where="w")[0].code == "correctness.output_type"


def test_it_detects_aliasing_subclasses_and_wrong_containers_in_the_child():
    x = torch.randn(4, 4)
    spans = checks.storage_spans([x])
    tensors, meta = checks.inspect_outputs(x[1:], spans, expect_tuple=False)
    assert meta[0]["aliases_input"] and tensors is not None
    _, meta = checks.inspect_outputs(x.clone(), spans, expect_tuple=False)
    assert not meta[0]["aliases_input"]

    class Sub(torch.Tensor):
        pass

    tensors, meta = checks.inspect_outputs(x.clone().as_subclass(Sub), spans, expect_tuple=False)
    assert tensors is None and not meta[0]["exact_tensor"]
    tensors, meta = checks.inspect_outputs(x.clone(), spans, expect_tuple=True)
    assert tensors is None


def test_it_flags_a_second_call_that_disagrees():
    ref = (torch.ones(3, 3, dtype=torch.float64),)
    same = checks.judge_determinism((torch.ones(3, 3),), (torch.ones(3, 3),), ref, (None,), atol=1e-4, rtol=1e-4, where="w")
    differ = checks.judge_determinism((torch.ones(3, 3),), (torch.zeros(3, 3),), ref, (None,), atol=1e-4, rtol=1e-4, where="w")
    assert same == [] and [r.code for r in differ] == ["correctness.nondeterministic"]


def test_it_only_accepts_registered_reason_codes():
    try:
        Reason("made.up", "x")
    except ValueError as exc:
        assert "REASON_CODES" in str(exc)
    else:
        raise AssertionError("an unregistered code was accepted")
