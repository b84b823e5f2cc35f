"""Test certificates made with openssl at test time: an authority, a server
certificate naming the addresses the agents dial, a client certificate, and
an authority that signed none of them."""
import os
import shutil
import subprocess

OPENSSL = shutil.which("openssl") or "/usr/bin/openssl"


def openssl_missing():
    """Why TLS tests cannot run here, or None."""
    if not os.access(OPENSSL, os.X_OK):
        return "needs openssl to make test certificates"
    return None


def _openssl(directory, *args):
    subprocess.run([OPENSSL, *args], cwd=directory, check=True, capture_output=True, timeout=60)


def make_certificates(directory, addresses):
    """Writes ca.pem, server.pem (subjectAltName: each of `addresses`, IPs or
    DNS names), client.pem, other-ca.pem and their keys (mode 600) into
    `directory`; returns {name: path} of them."""
    curve = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"]
    for ca in ("ca", "other-ca"):
        _openssl(directory, "req", "-x509", *curve, "-days", "1", "-subj", f"/CN=muster-{ca}",
                 "-keyout", f"{ca}.key", "-out", f"{ca}.pem")
    names = ",".join(("IP:" if a.replace(".", "").isdigit() or ":" in a else "DNS:") + a
                     for a in addresses)
    for leaf, extension in (("server", f"subjectAltName={names}\n"),
                            ("client", "extendedKeyUsage=clientAuth\n")):
        with open(os.path.join(directory, f"{leaf}.ext"), "w") as f:
            f.write(extension)
        _openssl(directory, "req", *curve, "-subj", f"/CN=muster-{leaf}", "-keyout",
                 f"{leaf}.key", "-out", f"{leaf}.csr")
        _openssl(directory, "x509", "-req", "-in", f"{leaf}.csr", "-CA", "ca.pem", "-CAkey",
                 "ca.key", "-CAcreateserial", "-days", "1", "-extfile", f"{leaf}.ext", "-out",
                 f"{leaf}.pem")
    out = {}
    for name in ("ca", "other-ca", "server", "client"):
        out[f"{name}.pem"] = os.path.join(directory, f"{name}.pem")
        out[f"{name}.key"] = os.path.join(directory, f"{name}.key")
        os.chmod(out[f"{name}.key"], 0o600)
    return out
