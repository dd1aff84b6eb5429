"""Jobs: executors, report, merge, switch, study, fine-tuning, release verification and the judge runner."""
