// Package token issues and verifies the platform's HMAC-SHA256 signed tokens.
//
// Three purposes exist, each with its own key material derived from the control
// plane's master secret, its own audience and its own lifetime:
//
//   - identity token (PurposeIdentity): held by one worker in
//     TALKIDE_WORKER_IDENTITY_TOKEN, bound to one (tenant, env), default TTL 90
//     days, accepted only by the mint endpoint.
//   - WorkerToken (PurposeGateway): minted per conversation, TTL 120 s, accepted
//     only by the gateway-proxy and the worker reporting endpoints.
//   - request token (PurposeWorkerRequest): signs one control plane → worker HTTP
//     request (method, path and body hash), TTL 60 s, accepted only by the worker
//     of the (tenant, env) it names.
//
// Tokens are JWS compact serialisations (RFC 7515) with alg HS256 and a "kid"
// header, built with github.com/golang-jwt/jwt/v5. The control plane holds the
// master secret; a worker holds only its identity token (a bearer credential,
// not a key) and the request-token key of its own (tenant, env). No key a worker
// holds can sign an identity token, a WorkerToken, or another tenant's request
// token, because each is derived with HKDF under a different label.
//
// This package does not store tokens, track revocation or talk HTTP; callers do.
package token
