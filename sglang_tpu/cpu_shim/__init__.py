"""Pure-torch stand-ins for native SGLang kernels, so real SGLang runs on any CPU (tests, dev).

Put `PYTHONPATH_ENTRY` on a real SGLang process's PYTHONPATH and `import sgl_kernel` finds the
package beside this file instead of the CUDA-only `sglang-kernel` wheel.
"""

from __future__ import annotations

from pathlib import Path

PYTHONPATH_ENTRY = Path(__file__).resolve().parent
