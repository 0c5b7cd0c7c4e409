"""The fake pynvml must not drift from the real nvidia-ml-py: names, parameters, constants, error classes."""

from __future__ import annotations

import dataclasses
import inspect

import pynvml
import pytest

from tests.fakes import fake_pynvml


@pytest.fixture(scope="module")
def fake() -> object:
    return fake_pynvml.FakeNvml(2).module()


def _functions(module: object) -> list[str]:
    return sorted(n for n in dir(module) if n.startswith("nvml") and inspect.isroutine(getattr(module, n)))


def _params(fn: object) -> list[tuple[str, bool]]:
    sig = inspect.signature(fn)  # type: ignore[arg-type]
    return [(p.name, p.default is not inspect.Parameter.empty) for p in sig.parameters.values()]


def test_every_fake_function_exists_in_real_pynvml_with_the_same_parameters(fake: object) -> None:
    names = _functions(fake)
    assert len(names) > 30
    for name in names:
        assert hasattr(pynvml, name), f"{name} is not in nvidia-ml-py"
        assert _params(getattr(fake, name)) == _params(getattr(pynvml, name)), name


def test_every_fake_constant_has_the_real_value(fake: object) -> None:
    names = [n for n in dir(fake) if n.startswith(fake_pynvml.CONSTANT_PREFIXES)]
    assert "NVML_FI_DEV_NVLINK_LINK_COUNT" in names
    for name in names:
        assert getattr(fake, name) == getattr(pynvml, name), name


def test_nvmlerror_of_a_code_is_the_same_subclass_as_in_real_pynvml(fake: object) -> None:
    codes = [v for n, v in vars(fake_pynvml).items() if n.startswith("NVML_ERROR_")]
    assert len(codes) == len(fake_pynvml.ERROR_CLASSES)
    for code in codes:
        mine, real = fake.NVMLError(code), pynvml.NVMLError(code)  # type: ignore[attr-defined]
        assert type(mine).__name__ == type(real).__name__
        assert mine.value == real.value == code
        assert isinstance(mine, getattr(fake, type(real).__name__))
    lost = fake.NVMLError_GpuIsLost()  # type: ignore[attr-defined]
    assert lost.value == pynvml.NVML_ERROR_GPU_IS_LOST
    assert str(fake.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)) == "Not Supported"  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    "name",
    [
        "c_nvmlMemory_t",
        "c_nvmlUtilization_t",
        "nvmlPciInfo_t",
        "c_nvmlValue_t",
        "c_nvmlFieldValue_t",
        "c_nvmlEventData_t",
    ],
)
def test_fake_return_types_only_use_real_structure_fields(name: str) -> None:
    mine = {f.name for f in dataclasses.fields(getattr(fake_pynvml, name))}
    real = {f[0] for f in getattr(pynvml, name)._fields_}
    assert mine <= real, mine - real
