"""Python runs this at start-up when `sglang_tpu.sgl_jax_cpu_shim` is on PYTHONPATH (the
launcher puts it there for SGLang-JAX on the cpu device): Pallas TPU kernels run in JAX's TPU
interpret mode in every process of the server (see the package's docstring for why).

Only where JAX runs on CPU alone (``JAX_PLATFORMS=cpu``): anywhere else it does nothing.
"""

import os

if os.environ.get("JAX_PLATFORMS") == "cpu":
    from jax.experimental.pallas import tpu as _pallas_tpu

    _pallas_tpu.set_tpu_interpret_mode()
