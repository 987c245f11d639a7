"""Start-up precompilation of grammar variants and warm decodes (filled in by the HTTP server)."""
