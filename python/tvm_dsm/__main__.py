"""``python -m tvm_dsm``: the ``tvm-dsm`` command (:mod:`tvm_dsm.cli`)."""

from .cli import main

main()
