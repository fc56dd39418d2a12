"""What a search strategy adds to the report of its sweep: its summary (with its own typed results), its markdown
section and its figures, through one protocol (lmtune.report.sections.base.ReportSection), one implementation per
strategy, chosen by the sweep's search name (lmtune.report.sections.registry.section_for)."""
