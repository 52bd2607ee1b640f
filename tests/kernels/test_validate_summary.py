"""Validation summaries and the negative-control verdict, on synthetic case records (no GPU)."""

from __future__ import annotations

from kernels.cases import Case, negative_control_cases
from kernels.validate import build_family, control_caught, validation_summary


def _rec(variant: str | None, passed: bool) -> dict:
    return {"case": Case("rms_norm", "bf16", 7, 4096, variant=variant), "applicable": True, "passed": passed,
            "ratio": 0.5 if passed else 9.0, "abs_err": 0.0, "alt_ratio": 0.5, "guards_ok": True,
            "residual_exact": True}


def test_families_split_staged_from_register_builds() -> None:
    assert build_family(Case("rms_norm", "bf16", 7, 4096)) == "register"
    assert build_family(Case("rms_norm", "bf16", 7, 4096, variant="t512r1p")) == "register"
    assert build_family(Case("rms_norm", "bf16", 7, 4096, variant="t256r1sp")) == "staged"
    assert {build_family(c) for c in negative_control_cases()} == {"register", "staged"}


def test_a_control_is_caught_only_when_every_family_fails() -> None:
    both = validation_summary([_rec(None, False), _rec("t256r1s", False), _rec("t256r1s", True)], 0.0)
    assert both["cases_failed_by_family"] == {"register": 1, "staged": 1} and control_caught(both)
    # the broken build slipped through the staged code path: not caught, though the suite failed
    register_only = validation_summary([_rec(None, False), _rec("t256r1s", True)], 0.0)
    assert register_only["passed"] is False and not control_caught(register_only)
    assert not control_caught(validation_summary([], 0.0))
