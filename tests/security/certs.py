"""A throwaway CA and a server certificate for 127.0.0.1/localhost, made with the openssl command."""

from __future__ import annotations

import dataclasses
import pathlib
import subprocess


@dataclasses.dataclass(frozen=True)
class TlsFiles:
    ca: pathlib.Path
    cert: pathlib.Path
    key: pathlib.Path


def make(directory: pathlib.Path) -> TlsFiles:
    directory.mkdir(parents=True, exist_ok=True)
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    ext = directory / "san.cnf"
    ext.write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    ca_key, ca, key, csr, cert = (
        directory / n for n in ("ca.key", "ca.pem", "server-key.pem", "server.csr", "server.pem")
    )

    def run(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=30)

    run(
        "req",
        "-x509",
        *ec,
        "-keyout",
        str(ca_key),
        "-out",
        str(ca),
        "-days",
        "1",
        "-subj",
        "/CN=healer-test-ca",
    )
    run("req", *ec, "-keyout", str(key), "-out", str(csr), "-subj", "/CN=localhost")
    run(
        "x509", "-req", "-in", str(csr), "-CA", str(ca), "-CAkey", str(ca_key), "-CAcreateserial",
        "-out", str(cert), "-days", "1", "-extfile", str(ext),
    )  # fmt: skip
    return TlsFiles(ca=ca, cert=cert, key=key)
