"""The controller's side of the plugin: owns the run's bridges and policy servers (the pool), its
books (the ledger), its inputs, the results file, the gate and the reports."""
