"""The upstream programs the end-to-end tests run: pins (versions.env), their build from Go modules
(build.py) and a local control plane made of them (cluster.py)."""
