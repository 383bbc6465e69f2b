"""Figures like the paper's: ``spec`` (what a figure shows), ``style`` (colours, markers, labels), ``inputs``
(results CSVs per suite, device and method), ``series`` (the curves), ``marks`` (what each mark means, the
legend's entries), ``figure`` (drawing and files), ``pareto`` (quality against time), ``fidelity`` (the
pretrained suite's renderer)."""
