/* fuzz_api.h: the entry points of the API fuzzer, as libFuzzer calls them,
 * for the replay driver that runs the corpus through them without
 * libFuzzer. */
#ifndef TP_FUZZ_API_H
#define TP_FUZZ_API_H

#include <stddef.h>
#include <stdint.h>

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#endif /* TP_FUZZ_API_H */
