"""Certificates made in the test: a CA, a broker certificate for chosen names, client certificates, and a
second CA that signed none of them (the "wrong CA"). Made with `cryptography`, written as PEM files."""
import datetime
import ipaddress
import time
from dataclasses import dataclass
from pathlib import Path

import time_machine
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

# Certificates are valid from a day before the real clock to a year after it: the tests that move the clock
# (TALLY_TEST_CLOCK_SHIFT_DAYS) move Python's clock, not OpenSSL's.
VALIDITY = datetime.timedelta(days=365)


@dataclass(frozen=True)
class Pki:
    ca_file: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    other_ca_file: Path     # a CA that signed nothing here


def _key():
    return ec.generate_private_key(ec.SECP256R1())


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _now() -> datetime.datetime:
    # time-machine's escape hatch: the real clock, which OpenSSL checks certificates against.
    hatch = time_machine.escape_hatch
    real = hatch.time.time() if hatch.is_travelling() else time.time()
    return datetime.datetime.fromtimestamp(real, datetime.UTC)


def _ca(common_name: str):
    key = _key()
    now = _now()
    cert = (x509.CertificateBuilder().subject_name(_name(common_name)).issuer_name(_name(common_name))
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(days=1)).not_valid_after(now + VALIDITY)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                         content_commitment=False, key_encipherment=False, data_encipherment=False,
                                         key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .sign(key, hashes.SHA256()))
    return key, cert


def _leaf(ca_key, ca_cert, common_name: str, names: list[str], usage):
    key = _key()
    now = _now()
    alternatives = []
    for name in names:
        try:
            alternatives.append(x509.IPAddress(ipaddress.ip_address(name)))
        except ValueError:
            alternatives.append(x509.DNSName(name))
    builder = (x509.CertificateBuilder().subject_name(_name(common_name)).issuer_name(ca_cert.subject)
               .public_key(key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(now - datetime.timedelta(days=1)).not_valid_after(now + VALIDITY)
               .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
               .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
               .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False))
    if alternatives:
        builder = builder.add_extension(x509.SubjectAlternativeName(alternatives), critical=False)
    return key, builder.sign(ca_key, hashes.SHA256())


def _write_cert(path: Path, cert) -> Path:
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return path


def _write_key(path: Path, key, password: str | None = None) -> Path:
    encryption = (serialization.BestAvailableEncryption(password.encode()) if password
                  else serialization.NoEncryption())
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, encryption))
    path.chmod(0o600)
    return path


def make_pki(directory: Path, server_names: tuple[str, ...] = ("localhost",),
             client_key_password: str | None = None) -> Pki:
    """A CA, a broker certificate valid for `server_names` (DNS names or IP addresses), a client certificate
    (its key encrypted with `client_key_password` when given) and an unrelated CA."""
    directory.mkdir(parents=True, exist_ok=True)
    ca_key, ca_cert = _ca("Tally test CA")
    server_key, server_cert = _leaf(ca_key, ca_cert, server_names[0], list(server_names),
                                    ExtendedKeyUsageOID.SERVER_AUTH)
    client_key, client_cert = _leaf(ca_key, ca_cert, "tally-client", [], ExtendedKeyUsageOID.CLIENT_AUTH)
    _, other_cert = _ca("Some other CA")
    return Pki(ca_file=_write_cert(directory / "ca.pem", ca_cert),
               server_cert=_write_cert(directory / "broker.pem", server_cert),
               server_key=_write_key(directory / "broker.key", server_key),
               client_cert=_write_cert(directory / "client.pem", client_cert),
               client_key=_write_key(directory / "client.key", client_key, client_key_password),
               other_ca_file=_write_cert(directory / "other-ca.pem", other_cert))
