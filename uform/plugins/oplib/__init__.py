"""The op library (native/uform_ops) as the e4m3 backend uses it: its binding (library) and
the graph rewrites that hand it fused work (attention, epilogues)."""
