"""Everything that only reads results CSVs: ``show`` tables, figures (``plots``), ``compare`` with its pure
``stats``."""
