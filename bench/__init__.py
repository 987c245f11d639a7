"""Side-by-side speed and quality measurements (see bench/README.md)."""
