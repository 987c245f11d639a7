"""What tests and bench/ share: the clips, text normalisation, a server process on loopback, and
reference copies of the packaged model. Not part of the installed service."""
