"""What makes `fit` fast without changing its answers (issue 20): deferred torch.compile while the optional
libraries load. No timing here: each test checks a mechanism."""

import sys
import types

from gpuwise import optional_libs


def test_a_deferred_compile_compiles_on_first_call_with_the_same_arguments():
    calls = []

    def real(model=None, **kwargs):
        calls.append((model, kwargs))
        return lambda *a, **k: ("compiled", model(*a, **k))

    deferred = optional_libs._deferred_compile(real)

    def f(x):
        return x + 1

    g = deferred(f, dynamic=False)
    assert calls == [] and g.__name__ == "f"           # nothing compiled (nor imported) yet
    assert g(1) == ("compiled", 2) and g(2) == ("compiled", 3)
    assert calls == [(f, {"dynamic": False})]            # once, with the arguments it was given
    h = deferred(mode="max-autotune")(f)                 # @torch.compile(...) as a decorator
    assert h(0) == ("compiled", 1) and calls[-1] == (f, {"mode": "max-autotune"})
    module = types.SimpleNamespace()                     # not a plain function: compiled at once, as before
    deferred(module)
    assert calls[-1] == (module, {})


def test_an_optional_library_is_imported_with_compile_deferred_and_torch_compile_restored(monkeypatch, tmp_path):
    import torch

    (tmp_path / "compiles_at_import.py").write_text(
        "import torch\nSEEN = torch.compile\n@torch.compile(dynamic=False)\ndef kernel(x):\n    return x\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    real = torch.compile
    mod = optional_libs.imported("compiles_at_import")
    try:
        assert torch.compile is real and mod.SEEN is not real   # deferred only while it loads
        assert mod.kernel.__name__ == "kernel" and not hasattr(mod.kernel, "_torchdynamo_orig_callable")
        assert optional_libs.imported("compiles_at_import") is mod  # imported once
    finally:
        sys.modules.pop("compiles_at_import", None)
