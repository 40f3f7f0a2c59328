#!/usr/bin/env python3
"""Verifies a signed agent card independently of colloquy's code: PyJWT (JWS, ES256/EdDSA) and
Trail of Bits' rfc8785 (RFC 8785 JCS canonical JSON), as the A2A specification's
AgentCardSignature asks: each signature is a JWS whose payload, detached, is the canonical form
of the card without its `signatures`.

The key set is named by the caller (trust is out of band), never taken from the card's `jku`.

Run:  $INTEROP_VENVS/sdk1/bin/python tests/interop/verify_card.py CARD JWKS [--tamper]
  CARD  the card's URL (http://host/.well-known/agent-card.json), a file, or - (stdin)
  JWKS  the trusted JSON Web Key Set's URL, or a file
  --tamper  change the card's `name` before verifying (the check must then fail)
  --sdk     also try the a2a-sdk's own verifier (a2a.utils.signing); informational only
Prints `VERIFIED <kid> <alg>` per signature that verifies (exit 0 if one does); else
`NOT VERIFIED: ...` and exit 1. Exit 2 on a usage or fetch error.
"""
import argparse
import base64
import hashlib
import json
import sys
import urllib.request

import jwt
import rfc8785
from jwt.api_jwk import PyJWK
from jwt.api_jws import PyJWS

ACCEPTED = ['ES256', 'EdDSA']


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b'=').decode('ascii')


def b64url_decode(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + '=' * (-len(text) % 4))


def load(source: str) -> bytes:
    if source == '-':
        return sys.stdin.buffer.read()
    if source.startswith(('http://', 'https://')):
        request = urllib.request.Request(source, headers={'Accept': 'application/json'})
        with urllib.request.urlopen(request, timeout=30) as response:  # noqa: S310 (test tool)
            return response.read()
    with open(source, 'rb') as f:
        return f.read()


def thumbprint(jwk: dict) -> str:
    """RFC 7638: SHA-256 of the required members, sorted, no whitespace."""
    required = {'EC': ('crv', 'kty', 'x', 'y'), 'OKP': ('crv', 'kty', 'x'), 'RSA': ('e', 'kty', 'n')}
    members = {k: jwk[k] for k in required[jwk['kty']]}
    text = json.dumps(members, separators=(',', ':'), sort_keys=True)
    return b64url(hashlib.sha256(text.encode('utf-8')).digest())


def verify(card: dict, jwks: dict) -> tuple[list[tuple[str, str]], list[str]]:
    """The (kid, alg) of each signature that verifies with a key of `jwks`; reasons for the rest."""
    signatures = card.get('signatures') or []
    unsigned = {k: v for k, v in card.items() if k != 'signatures'}
    payload = rfc8785.dumps(unsigned)  # bytes, UTF-8
    encoded_payload = b64url(payload)
    keys = {k.get('kid'): k for k in jwks.get('keys', [])}
    verified, why = [], []
    if not signatures:
        why.append('the card has no signatures')
    for i, sig in enumerate(signatures):
        try:
            header = json.loads(b64url_decode(sig['protected']))
        except Exception as e:  # noqa: BLE001
            why.append(f'signature {i}: unreadable protected header: {e}')
            continue
        kid, alg = header.get('kid'), header.get('alg')
        jwk = keys.get(kid)
        if jwk is None:
            why.append(f'signature {i}: key {kid!r} is not in the trusted set')
            continue
        if thumbprint(jwk) != kid:
            why.append(f'signature {i}: kid {kid!r} is not the RFC 7638 thumbprint of its key')
            continue
        if alg not in ACCEPTED:
            why.append(f'signature {i}: algorithm {alg!r} not accepted')
            continue
        token = f"{sig['protected']}.{encoded_payload}.{sig['signature']}"
        try:
            decoded = PyJWS().decode_complete(token, key=PyJWK(jwk, algorithm=alg), algorithms=[alg])
        except jwt.PyJWTError as e:
            why.append(f'signature {i} by {kid!r} ({alg}): {type(e).__name__}: {e}')
            continue
        if decoded['payload'] != payload:
            why.append(f'signature {i}: the verified payload is not the canonical card')
            continue
        verified.append((kid, alg))
    return verified, why


def sdk_verifier(card: dict, jwks: dict) -> str:
    """What the a2a-sdk's own verifier (its proto round trip, then JCS) says of the card."""
    try:
        from a2a.client.card_resolver import parse_agent_card
        from a2a.utils.signing import create_signature_verifier
        keys = {k.get('kid'): k for k in jwks.get('keys', [])}
        verifier = create_signature_verifier(
            lambda kid, _jku: PyJWK(keys[kid]), algorithms=ACCEPTED)
        verifier(parse_agent_card(json.loads(json.dumps(card))))
        return 'ok'
    except Exception as e:  # noqa: BLE001
        return f'failed: {type(e).__name__}: {e}'


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument('card')
    ap.add_argument('jwks')
    ap.add_argument('--tamper', action='store_true')
    ap.add_argument('--sdk', action='store_true')
    args = ap.parse_args()
    try:
        card = json.loads(load(args.card))
        jwks = json.loads(load(args.jwks))
    except Exception as e:  # noqa: BLE001
        print(f'ERROR reading the card or key set: {type(e).__name__}: {e}')
        sys.exit(2)
    if not isinstance(card, dict) or not isinstance(jwks, dict):
        print('ERROR: the card and the key set must be JSON objects')
        sys.exit(2)
    if args.tamper:
        card['name'] = f"{card.get('name', '')} (tampered)"
    for sig in card.get('signatures') or []:
        try:
            print(f"protected header: {json.loads(b64url_decode(sig['protected']))}")
        except Exception:  # noqa: BLE001
            pass
    if args.sdk:
        print(f'SDK-VERIFIER {sdk_verifier(card, jwks)}')
    verified, why = verify(card, jwks)
    for kid, alg in verified:
        print(f'VERIFIED {kid} {alg}')
    if not verified:
        print('NOT VERIFIED: ' + '; '.join(why))
        sys.exit(1)


if __name__ == '__main__':
    main()
