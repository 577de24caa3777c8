"""Bundles as data: variant contracts, typed schemas of the JSON files, conventions, norm
stats, the bundle's paths and checks (one resolver), and golden files."""
