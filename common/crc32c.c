#include "kvf/crc32c.h"

#include <pthread.h>
#include <string.h>

#if defined(__aarch64__)
#include <sys/auxv.h>
#ifndef HWCAP_CRC32
#define HWCAP_CRC32 (1 << 7) /* AT_HWCAP bit of the ARMv8 CRC32 instructions */
#endif
#endif

#define CRC32C_POLY 0x82f63b78u /* reflected Castagnoli polynomial */

static uint32_t crc_table[8][256];
#if defined(__x86_64__) || defined(__aarch64__)
static int crc_have_hw; /* the CPU has the CRC32C instructions (SSE4.2 / ARMv8 CRC) */
#endif
static pthread_once_t crc_once = PTHREAD_ONCE_INIT;

static void crc_init(void)
{
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++)
            c = (c >> 1) ^ (CRC32C_POLY & (0u - (c & 1u)));
        crc_table[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; i++)
        for (int t = 1; t < 8; t++)
            crc_table[t][i] = (crc_table[t - 1][i] >> 8) ^ crc_table[0][crc_table[t - 1][i] & 0xff];
#if defined(__x86_64__)
    __builtin_cpu_init();
    crc_have_hw = __builtin_cpu_supports("sse4.2");
#elif defined(__aarch64__) && defined(__ARM_FEATURE_CRC32)
    crc_have_hw = 1; /* the build targets CPUs that all have it */
#elif defined(__aarch64__)
    crc_have_hw = (getauxval(AT_HWCAP) & HWCAP_CRC32) != 0;
#endif
}

/* Slicing-by-8 over the table. */
static uint32_t crc_sw(uint32_t crc, const uint8_t *p, size_t len)
{
    while (len && ((uintptr_t)p & 7)) {
        crc = (crc >> 8) ^ crc_table[0][(crc ^ *p++) & 0xff];
        len--;
    }
    while (len >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        w ^= crc;
        crc = crc_table[7][w & 0xff] ^ crc_table[6][(w >> 8) & 0xff] ^
              crc_table[5][(w >> 16) & 0xff] ^ crc_table[4][(w >> 24) & 0xff] ^
              crc_table[3][(w >> 32) & 0xff] ^ crc_table[2][(w >> 40) & 0xff] ^
              crc_table[1][(w >> 48) & 0xff] ^ crc_table[0][w >> 56];
        p += 8;
        len -= 8;
    }
    while (len--)
        crc = (crc >> 8) ^ crc_table[0][(crc ^ *p++) & 0xff];
    return crc;
}

#if defined(__x86_64__)
__attribute__((target("sse4.2"))) static uint32_t crc_hw(uint32_t crc, const uint8_t *p, size_t len)
{
    uint64_t c = crc;
    while (len && ((uintptr_t)p & 7)) {
        c = __builtin_ia32_crc32qi((uint32_t)c, *p++);
        len--;
    }
    while (len >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        c = __builtin_ia32_crc32di(c, w);
        p += 8;
        len -= 8;
    }
    while (len--)
        c = __builtin_ia32_crc32qi((uint32_t)c, *p++);
    return (uint32_t)c;
}
#endif

#if defined(__aarch64__)
/* The ARMv8 CRC32C instructions; built for them whatever the target's
 * baseline, and called only where the CPU has them (crc_init). */
__attribute__((target("+crc"))) static uint32_t crc_hw(uint32_t crc, const uint8_t *p, size_t len)
{
    while (len && ((uintptr_t)p & 7)) {
        crc = __builtin_aarch64_crc32cb(crc, *p++);
        len--;
    }
    while (len >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        crc = __builtin_aarch64_crc32cx(crc, w);
        p += 8;
        len -= 8;
    }
    while (len--)
        crc = __builtin_aarch64_crc32cb(crc, *p++);
    return crc;
}
#endif

uint32_t kvf_crc32c(uint32_t crc, const void *data, size_t len)
{
    pthread_once(&crc_once, crc_init);
    crc = ~crc;
#if defined(__x86_64__) || defined(__aarch64__)
    if (crc_have_hw)
        return ~crc_hw(crc, data, len);
#endif
    return ~crc_sw(crc, data, len);
}

uint32_t kvf_crc32c_table(uint32_t crc, const void *data, size_t len)
{
    pthread_once(&crc_once, crc_init);
    return ~crc_sw(~crc, data, len);
}

const char *kvf_crc32c_impl(void)
{
    pthread_once(&crc_once, crc_init);
#if defined(__x86_64__)
    if (crc_have_hw)
        return "sse4.2";
#elif defined(__aarch64__)
    if (crc_have_hw)
        return "armv8-crc";
#endif
    return "table";
}
