#!/usr/bin/env python3
"""docs/push.md's receiver example, run against a real notification by tests/it/push.rs.

Usage: verify_notification.py JWT BODY_FILE JWKS_FILE  ->  prints VERIFIED <jti>, exit 0
(the function below is the documentation's, verbatim).
"""
import sys

import base64, hashlib, json, time
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.utils import encode_dss_signature

def b64url(text):
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))

def verify_notification(jwt, body, jwks, max_age=300):
    """The claims if `jwt` (the X-Colloquy-Signature header) signs `body` (raw bytes)."""
    header_b64, claims_b64, signature_b64 = jwt.split(".")
    header = json.loads(b64url(header_b64))
    if header.get("alg") != "ES256":
        raise ValueError("unexpected algorithm")
    jwk = next(k for k in jwks["keys"] if k["kid"] == header["kid"])
    key = ec.EllipticCurvePublicNumbers(
        int.from_bytes(b64url(jwk["x"]), "big"),
        int.from_bytes(b64url(jwk["y"]), "big"),
        ec.SECP256R1(),
    ).public_key()
    raw = b64url(signature_b64)  # r || s, 32 bytes each
    signature = encode_dss_signature(int.from_bytes(raw[:32], "big"), int.from_bytes(raw[32:], "big"))
    key.verify(signature, f"{header_b64}.{claims_b64}".encode(), ec.ECDSA(hashes.SHA256()))
    claims = json.loads(b64url(claims_b64))
    if claims["request_body_sha256"] != hashlib.sha256(body).hexdigest():
        raise InvalidSignature("the body is not the one signed")
    if abs(time.time() - claims["iat"]) > max_age:
        raise InvalidSignature("too old")
    return claims  # then drop it if claims["jti"] was seen before


if __name__ == "__main__":
    jwt_text, body_path, jwks_path = sys.argv[1:4]
    body = open(body_path, "rb").read()
    jwks = json.load(open(jwks_path))
    try:
        claims = verify_notification(jwt_text, body, jwks)
    except Exception as e:  # noqa: BLE001
        print(f"REFUSED {type(e).__name__}: {e}")
        sys.exit(1)
    print(f"VERIFIED {claims['jti']}")
