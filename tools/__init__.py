"""Programs around seerfs: PFS emulator, dataset generator, benchmarks, simulator, plots, demo."""
