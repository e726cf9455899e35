/*
 * base64.c — base64 for proto3 JSON bytes (docs/wire.md §4): standard alphabet written
 * (through OpenSSL's EVP block codec), standard or URL-safe alphabet read, padding
 * optional.
 *
 * Decoding is on the hot path of every answer (a cell's stdout arrives in base64, and
 * verification hashes the decoded bytes), so it is done here rather than through
 * EVP_DecodeBlock, which cost as much as the SHA-256 of its output: 32 characters at a
 * time with AVX2 where the CPU has it (the lookup-and-shuffle method of Muła and
 * Lemire, "Faster Base64 Encoding and Decoding using AVX2 Instructions", 2018), and a
 * table a quantum at a time for the rest and on other CPUs.
 */
#include "internal.h"

#include <openssl/evp.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define HAVE_AVX2_PATH 1
#include <immintrin.h>
#endif

/* Six-bit value of each character, 0xFF for a character outside both alphabets. */
#define X 0xFF
static const unsigned char sextet[256] = {
    X,  X,  X,  X,  X,  X,  X,  X,  X,  X,  X,  X,  X,  X,  X,  X,
    X,  X,  X,  X,  X,  X,  X,  X,  X,  X,  X,  X,  X,  X,  X,  X,
    X,  X,  X,  X,  X,  X,  X,  X,  X,  X,  X,  62, X,  62, X,  63,   /* + - / */
    52, 53, 54, 55, 56, 57, 58, 59, 60, 61, X,  X,  X,  X,  X,  X,
    X,  0,  1,  2,  3,  4,  5,  6,  7,  8,  9,  10, 11, 12, 13, 14,
    15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, X,  X,  X,  X,  63,  /* _ */
    X,  26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40,
    41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51, X,  X,  X,  X,  X,
    X,  X,  X,  X,  X,  X,  X,  X,  X,  X,  X,  X,  X,  X,  X,  X,
    X,  X,  X,  X,  X,  X,  X,  X,  X,  X,  X,  X,  X,  X,  X,  X,
    X,  X,  X,  X,  X,  X,  X,  X,  X,  X,  X,  X,  X,  X,  X,  X,
    X,  X,  X,  X,  X,  X,  X,  X,  X,  X,  X,  X,  X,  X,  X,  X,
    X,  X,  X,  X,  X,  X,  X,  X,  X,  X,  X,  X,  X,  X,  X,  X,
    X,  X,  X,  X,  X,  X,  X,  X,  X,  X,  X,  X,  X,  X,  X,  X,
    X,  X,  X,  X,  X,  X,  X,  X,  X,  X,  X,  X,  X,  X,  X,  X,
    X,  X,  X,  X,  X,  X,  X,  X,  X,  X,  X,  X,  X,  X,  X,  X,
};
#undef X

#ifdef HAVE_AVX2_PATH
/* Decodes whole blocks of 32 standard-alphabet characters from s[0..n) into o while
 * at least 45 remain (so the 32-byte store of 24 bytes stays inside an output sized
 * for the whole text); returns the characters consumed.  It stops at the first block
 * holding anything else (URL-safe characters, padding, junk), which the table loop
 * then reads, and judges. */
__attribute__((target("avx2"))) static size_t decode_avx2(const unsigned char *s, size_t n,
                                                          unsigned char *o)
{
    /* Per 16-byte lane: a character's high and low nibble classes, whose AND is zero
     * exactly for [A-Za-z0-9+/], and the offset that turns it into its value, chosen
     * by the high nibble ('/' moved to its own slot). */
    const __m256i lut_lo = _mm256_setr_epi8(
        0x15, 0x11, 0x11, 0x11, 0x11, 0x11, 0x11, 0x11, 0x11, 0x11, 0x13, 0x1A, 0x1B, 0x1B, 0x1B, 0x1A,
        0x15, 0x11, 0x11, 0x11, 0x11, 0x11, 0x11, 0x11, 0x11, 0x11, 0x13, 0x1A, 0x1B, 0x1B, 0x1B, 0x1A);
    const __m256i lut_hi = _mm256_setr_epi8(
        0x10, 0x10, 0x01, 0x02, 0x04, 0x08, 0x04, 0x08, 0x10, 0x10, 0x10, 0x10, 0x10, 0x10, 0x10, 0x10,
        0x10, 0x10, 0x01, 0x02, 0x04, 0x08, 0x04, 0x08, 0x10, 0x10, 0x10, 0x10, 0x10, 0x10, 0x10, 0x10);
    const __m256i lut_roll = _mm256_setr_epi8(
        0, 16, 19, 4, -65, -65, -71, -71, 0, 0, 0, 0, 0, 0, 0, 0,
        0, 16, 19, 4, -65, -65, -71, -71, 0, 0, 0, 0, 0, 0, 0, 0);
    const __m256i mask_2f = _mm256_set1_epi8(0x2F);
    /* four sextets a,b,c,d (a first) of each 32-bit lane into its 24 bits, then the
     * three bytes of each lane packed, then the lanes' 12 bytes joined */
    const __m256i merge_ab = _mm256_set1_epi32(0x01400140);
    const __m256i merge_abc = _mm256_set1_epi32(0x00011000);
    const __m256i pack = _mm256_setr_epi8(
        2, 1, 0, 6, 5, 4, 10, 9, 8, 14, 13, 12, -1, -1, -1, -1,
        2, 1, 0, 6, 5, 4, 10, 9, 8, 14, 13, 12, -1, -1, -1, -1);
    const __m256i join = _mm256_setr_epi32(0, 1, 2, 4, 5, 6, -1, -1);
    size_t i = 0;
    for (; n - i >= 45; i += 32, o += 24) {
        __m256i str = _mm256_loadu_si256((const __m256i *)(s + i));
        __m256i hi_nibbles = _mm256_and_si256(_mm256_srli_epi32(str, 4), mask_2f);
        __m256i lo_nibbles = _mm256_and_si256(str, mask_2f);
        __m256i hi = _mm256_shuffle_epi8(lut_hi, hi_nibbles);
        __m256i lo = _mm256_shuffle_epi8(lut_lo, lo_nibbles);
        if (!_mm256_testz_si256(lo, hi))
            break;
        __m256i eq_2f = _mm256_cmpeq_epi8(str, mask_2f);
        __m256i roll = _mm256_shuffle_epi8(lut_roll, _mm256_add_epi8(eq_2f, hi_nibbles));
        str = _mm256_add_epi8(str, roll);
        str = _mm256_maddubs_epi16(str, merge_ab);
        str = _mm256_madd_epi16(str, merge_abc);
        str = _mm256_shuffle_epi8(str, pack);
        str = _mm256_permutevar8x32_epi32(str, join);
        _mm256_storeu_si256((__m256i *)o, str);
    }
    return i;
}

static bool cpu_has_avx2(void)
{
    static int has = -1;  /* a benign race: every thread computes the same answer */
    if (has < 0) {
        __builtin_cpu_init();
        has = __builtin_cpu_supports("avx2") ? 1 : 0;
    }
    return has == 1;
}
#endif

int plm_base64_decode(const char *text, size_t n, unsigned char **out, size_t *len)
{
    const unsigned char *s = (const unsigned char *)text;
    *out = NULL;
    *len = 0;
    while (n > 0 && s[n - 1] == '=')
        n--;
    if (n % 4 == 1)
        return -1;
    unsigned char *buf = malloc(n / 4 * 3 + 3);
    if (!buf)
        return -1;
    unsigned char *o = buf;
    size_t i = 0;
#ifdef HAVE_AVX2_PATH
    if (n >= 45 && cpu_has_avx2()) {
        i = decode_avx2(s, n, o);
        o += i / 4 * 3;
    }
#endif
    for (; i + 4 <= n; i += 4, o += 3) {
        unsigned a = sextet[s[i]], b = sextet[s[i + 1]], c = sextet[s[i + 2]], d = sextet[s[i + 3]];
        if ((a | b | c | d) & 0x80)
            goto bad;
        unsigned w = a << 18 | b << 12 | c << 6 | d;
        o[0] = (unsigned char)(w >> 16);
        o[1] = (unsigned char)(w >> 8);
        o[2] = (unsigned char)w;
    }
    if (n - i >= 2) {
        /* a final 2 or 3 characters: 1 or 2 bytes (bits past them are ignored) */
        unsigned a = sextet[s[i]], b = sextet[s[i + 1]], c = n - i == 3 ? sextet[s[i + 2]] : 0;
        if ((a | b | c) & 0x80)
            goto bad;
        unsigned w = a << 18 | b << 12 | c << 6;
        *o++ = (unsigned char)(w >> 16);
        if (n - i == 3)
            *o++ = (unsigned char)(w >> 8);
    }
    *o = '\0';
    *out = buf;
    *len = (size_t)(o - buf);
    return 0;
bad:
    free(buf);
    return -1;
}

char *plm_base64_encode(const unsigned char *data, size_t len, bool padded)
{
    char *out = malloc(4 * ((len + 2) / 3) + 1);
    if (!out)
        return NULL;
    /* (EVP_EncodeBlock takes an int length: the wire's bodies are capped far below it;
     * it runs at about 2.4 GB/s here, a plain table loop no faster) */
    int n = EVP_EncodeBlock((unsigned char *)out, data, (int)len);
    if (!padded) {
        while (n > 0 && out[n - 1] == '=')
            out[--n] = '\0';
    }
    return out;
}
