"""Real TLS peers for the end-to-end tests: certificates and openssl s_server."""

from __future__ import annotations

import os
import re
import shutil
import signal
import ssl
import subprocess
from pathlib import Path

import harness

OPENSSL = shutil.which("openssl")


class Cert:
    def __init__(self, cn: str, cert: Path, key: Path):
        self.cn = cn
        self.cert = cert
        self.key = key
        self.der = ssl.PEM_cert_to_DER_cert(cert.read_text())


def make_key(directory: Path) -> Path:
    key = directory / "key.pem"
    subprocess.run([OPENSSL, "genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048",
                    "-out", str(key)], check=True, capture_output=True, timeout=60)
    return key


def make_cert(directory: Path, cn: str, key: Path) -> Cert:
    """A self-signed certificate for cn. Certificates are what identifies a
    backend here, so they are per test; the RSA key behind them is shared by
    the run because generating one costs about half a second."""
    cert = directory / f"{cn}.pem"
    subprocess.run(
        [OPENSSL, "req", "-x509", "-key", str(key), "-subj", f"/CN={cn}",
         "-days", "1", "-out", str(cert)],
        check=True, capture_output=True, timeout=60)
    return Cert(cn, cert, key)


class TlsServer:
    """`openssl s_server -rev`: completes real handshakes, answers each line
    reversed, and prints one CONNECTION ESTABLISHED per handshake."""

    def __init__(self, cert: Cert, alpn: str | None = "h2,http/1.1"):
        self.cert = cert
        cmd = [OPENSSL, "s_server", "-accept", "127.0.0.1:0", "-cert", str(cert.cert),
               "-key", str(cert.key), "-rev"]
        if alpn:
            cmd += ["-alpn", alpn]
        self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT)
        self.log = harness.LineLog(self.proc.stdout)
        m = self.log.wait_for(r"^ACCEPT (\S+)$", timeout=harness.START_TIMEOUT)
        self.host, self.port = harness.split_addr(m.group(1))
        self.address = f"{self.host}:{self.port}"

    @property
    def cn(self) -> str:
        return self.cert.cn

    def handshakes(self) -> int:
        return len(self.log.matches(r"^CONNECTION ESTABLISHED"))

    def wait_handshakes(self, n: int) -> int:
        """Waits (bounded) until s_server has reported n handshakes; returns the count."""
        try:
            self.log.wait_for(r"^CONNECTION ESTABLISHED", count=n, timeout=5) if n else None
        except harness.Timeout:
            pass
        return self.handshakes()

    def stop(self):
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=5)
        self.log.join()


def subject_cn(s_client_output: str) -> str | None:
    m = re.search(r"^subject=.*?CN\s*=\s*([^,/\n]+)", s_client_output, re.M)
    return m.group(1).strip() if m else None
