"""``topk-bench report``: results as a static site (an ``index.html``, its style sheet, its figures and its CSVs),
for a browser with no server and no network: no script, nothing loaded from elsewhere.

- :mod:`.parts`: what the page says of each suite, device and method (tables, figures, trust, provenance,
  roofline fractions, crossovers), from the readers ``show`` and ``plot`` use;
- :mod:`.history`: a folder of result folders, one per commit, as series over commits (steps, the gate's verdicts);
- :mod:`.history_figure`: a case's time and peak drawn against the commits, each point a link to its commit;
- :mod:`.build`: reading everything first, writing the site into a new folder, then putting it in place.

What the files say is data: the template escapes every text (Jinja's autoescape, after
:func:`topk_bench.untrusted.shown`), and every link the page makes stays inside the output folder, except the
commit links the user's ``--commit-url`` makes of a hexadecimal sha.
"""
