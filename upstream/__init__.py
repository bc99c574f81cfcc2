"""Upstream programs the project fetches from their Go modules: pins (versions.env) and fetch steps.

Nothing of their code is committed: like pip with packages, the Go toolchain fetches the modules
through the module proxy (checked against the checksum database) into its own cache, and the steps
here copy what the tests need (CRD schemas) or build what they run.
"""
