"""The harness: profile one block, split its time, swap its attention, compare, extrapolate, report.

Modules: ``session`` (warm-up, clean timing, profiled window), ``categories`` (time split by launching op),
``swap`` (diffusers dispatcher registration / processor replacement, attention and norm ranges),
``backends`` (view of ``ditprof.kernels.registry``), ``extrapolate``, ``report``, ``plots``, ``memory``
(``--gpu-memory``), ``atomic`` (staged run folders), ``environment``, ``runner`` and ``commands`` (CLI).
"""
