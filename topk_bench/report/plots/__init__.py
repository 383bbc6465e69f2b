"""Figures like the paper's: ``spec`` (what a figure shows), ``style`` (colours, markers, labels),
``inputs`` (results CSVs per suite, device and method), ``figure`` (drawing and files), ``fidelity``
(the pretrained suite's renderer)."""
