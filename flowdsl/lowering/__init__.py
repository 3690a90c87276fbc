"""flowdsl's numba lowering: types, the extern table, inline PTX, and the kernel compiler.

Importing this package costs nothing: the device surface is bound to numba by
:mod:`flowdsl.lowering.bindings`, which the compiler imports.
"""
