#!/bin/sh
# test_verify.sh — signed records (issue 16 item 4): sandboxd --record-key signs every
# answer's record in the reference's format (a DSSE envelope around an in-toto
# statement, Ed25519), and `berth verify --pub KEY FILE...` checks saved records offline
# with one verdict per record and exit 1 when any fails.  The golden vectors are the
# reference's own signed session example (tests/vectors/attest).  Prints cmocka-style
# summary lines for tests/run.sh.
set -u
BUILD=${BUILD:-build}
BERTH="$BUILD/berth"
VEC=tests/vectors/attest
. tests/lib/shtest.sh

# The reference's signed envelopes verify under its published key, and its key id is
# the SHA-256 of the key's PKIX DER as the envelopes name it.
test_golden_vectors_of_the_reference_verify() {
    "$BERTH" verify --pub "$VEC/harness.pub" "$VEC/bundle.jsonl" > "$work/out" 2>&1
    rc=$?; cat "$work/out"
    [ $rc -eq 0 ] &&
    has "$work/out" "bundle.jsonl:1: ok: record 7ae4e55a3df8d282 (openshell, container; session 7388fb93a024 call 1), signed by 13a2affd2e055172" &&
    has "$work/out" "bundle.jsonl:2: ok: session 7388fb93a024 closed after 5 calls"
}

# One signed run from a real sandboxd, saved as answered.
signed_run() {   # signed_run KEYFILE OUTFILE CODE
    rm -f "$work/signer.out"
    start_sandboxd signer --token-file "$work/tokens" --provider echo --record-key "$1" || return 1
    curl -s -X POST -H 'Content-Type: application/json' -H "Authorization: Bearer tok-verify" \
        -d "{\"protocol\":3,\"javascript\":{\"code\":\"$3\"}}" \
        "$url/plimsoll.v1.SandboxService/Run" > "$2"
    kill "$pid"; wait "$pid"
    has "$2" '"recordEnvelope"'
}

setup_keys() {
    echo tok-verify > "$work/tokens"
    openssl genpkey -algorithm ed25519 -out "$work/a.key" 2>/dev/null &&
    openssl pkey -in "$work/a.key" -pubout -out "$work/a.pub" &&
    openssl genpkey -algorithm ed25519 -out "$work/b.key" 2>/dev/null &&
    openssl pkey -in "$work/b.key" -pubout -out "$work/b.pub"
}

# Sign then verify: ok under the signing key; under another key, or with the output
# edited, or with the signed payload edited, each record fails with its own verdict.
test_sign_then_verify_and_every_tampering_fails() {
    setup_keys || return 1
    signed_run "$work/a.key" "$work/run.json" "console.log(1)" || return 1
    "$BERTH" verify --pub "$work/a.pub" "$work/run.json" > "$work/ok" 2>&1 || { cat "$work/ok"; return 1; }
    has "$work/ok" "run.json: ok: record " || return 1
    "$BERTH" verify --pub "$work/b.pub" "$work/run.json" > "$work/wrong" 2>&1 && return 1
    has "$work/wrong" "FAIL: no signature by this key verifies" || return 1
    # the output changed after signing (stdout "javascript 1: console.log(1)" -> "...(2)")
    python3 - "$work/run.json" "$work/edited.json" <<'PY' || return 1
import base64, json, sys
r = json.load(open(sys.argv[1]))
out = base64.b64decode(r["javascript"]["stdout"]).replace(b"(1)", b"(2)")
r["javascript"]["stdout"] = base64.b64encode(out).decode()
json.dump(r, open(sys.argv[2], "w"))
# the signed payload changed: the record's provider renamed inside the statement
p = json.loads(base64.b64decode(r["recordEnvelope"]["payload"]))
p["predicate"]["provider"] = "e2b"
r2 = json.load(open(sys.argv[1]))
r2["recordEnvelope"]["payload"] = base64.b64encode(json.dumps(p).encode()).decode()
json.dump(r2, open(sys.argv[2] + ".payload", "w"))
PY
    "$BERTH" verify --pub "$work/a.pub" "$work/edited.json" > "$work/edited" 2>&1 && return 1
    has "$work/edited" "FAIL: the response does not match its record's result digest" || return 1
    "$BERTH" verify --pub "$work/a.pub" "$work/edited.json.payload" > "$work/payload" 2>&1 && return 1
    has "$work/payload" "FAIL: no signature by this key verifies"
}

# A record saved from a daemon without a key is reported "not signed"; in a file of
# several records each gets its verdict and the exit status is 1 when any fails.
test_missing_signature_is_a_clear_verdict_and_exit_1() {
    setup_keys || return 1
    signed_run "$work/a.key" "$work/signed.json" "1" || return 1
    start_sandboxd plain --token-file "$work/tokens" --provider echo || return 1
    curl -s -X POST -H 'Content-Type: application/json' -H "Authorization: Bearer tok-verify" \
        -d '{"protocol":3,"javascript":{"code":"2"}}' "$url/plimsoll.v1.SandboxService/Run" > "$work/plain.json"
    kill "$pid"; wait "$pid"
    { tr -d '\n' < "$work/signed.json"; echo; tr -d '\n' < "$work/plain.json"; echo; } > "$work/both.jsonl"
    "$BERTH" verify --pub "$work/a.pub" "$work/both.jsonl" > "$work/out" 2>&1
    rc=$?; cat "$work/out"
    [ $rc -eq 1 ] &&
    has "$work/out" "both.jsonl:1: ok: record " &&
    has "$work/out" "both.jsonl:2: FAIL: not signed: the response carries no recordEnvelope" &&
    has "$work/out" "verify: some records FAILED"
}

test_usage_and_a_bad_key_file() {
    "$BERTH" verify > "$work/u" 2>&1; [ $? -eq 2 ] || return 1
    has "$work/u" "usage: berth verify --pub KEY.pub FILE..." || return 1
    echo x > "$work/tokens"
    echo "not a key" > "$work/bad.key"
    "$BUILD/sandboxd" --listen 127.0.0.1:0 --token-file "$work/tokens" --provider echo \
        --record-key "$work/bad.key" > /dev/null 2> "$work/err"
    [ $? -eq 2 ] && has "$work/err" "is not a PEM (PKCS #8) Ed25519 private key"
}

run golden_vectors_of_the_reference_verify
run sign_then_verify_and_every_tampering_fails
run missing_signature_is_a_clear_verdict_and_exit_1
run usage_and_a_bad_key_file

finish
