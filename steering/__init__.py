"""steering: see the package README section; filled in by its issue."""
