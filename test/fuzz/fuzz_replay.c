/* fuzz_replay: runs files through the API fuzzer's entry point without
 * libFuzzer, so that every build (gcc, sanitizers) replays the corpus under
 * CTest. Arguments are files or directories (each regular file in them, in
 * name order). Exits 0 when every input ran; a finding aborts. */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "fuzz_api.h"

static int run_file(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) {
    fprintf(stderr, "fuzz_replay: cannot open %s\n", path);
    return 1;
  }
  size_t cap = 1 << 16, n = 0;
  unsigned char *buf = malloc(cap);
  for (size_t got; buf && (got = fread(buf + n, 1, cap - n, f)) > 0;) {
    n += got;
    if (n == cap) {
      unsigned char *more = realloc(buf, cap * 2);
      if (!more) {
        free(buf);
        buf = NULL;
        break;
      }
      buf = more;
      cap *= 2;
    }
  }
  fclose(f);
  if (!buf) {
    fprintf(stderr, "fuzz_replay: out of memory reading %s\n", path);
    return 1;
  }
  LLVMFuzzerTestOneInput(buf, n);
  free(buf);
  return 0;
}

static int by_name(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

static int run_dir(const char *dir, int *count) {
  DIR *d = opendir(dir);
  if (!d) {
    fprintf(stderr, "fuzz_replay: cannot open directory %s\n", dir);
    return 1;
  }
  char **names = NULL;
  size_t n = 0, cap = 0;
  for (struct dirent *e; (e = readdir(d)) != NULL;) {
    if (e->d_name[0] == '.')
      continue;
    if (n == cap) {
      cap = cap ? cap * 2 : 64;
      char **more = realloc(names, cap * sizeof *names);
      if (!more)
        break;
      names = more;
    }
    size_t len = strlen(dir) + strlen(e->d_name) + 2;
    names[n] = malloc(len);
    if (!names[n])
      break;
    snprintf(names[n], len, "%s/%s", dir, e->d_name);
    n++;
  }
  closedir(d);
  if (n)
    qsort(names, n, sizeof *names, by_name);
  int bad = 0;
  for (size_t i = 0; i < n; i++) {
    struct stat st;
    if (stat(names[i], &st) == 0 && S_ISREG(st.st_mode)) {
      bad |= run_file(names[i]);
      (*count)++;
    }
    free(names[i]);
  }
  free(names);
  return bad;
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s FILE_OR_DIRECTORY...\n", argv[0]);
    return 2;
  }
  LLVMFuzzerInitialize(&argc, &argv);
  int count = 0, bad = 0;
  for (int i = 1; i < argc; i++) {
    struct stat st;
    if (stat(argv[i], &st) != 0) {
      fprintf(stderr, "fuzz_replay: %s does not exist\n", argv[i]);
      bad = 1;
    } else if (S_ISDIR(st.st_mode)) {
      bad |= run_dir(argv[i], &count);
    } else {
      bad |= run_file(argv[i]);
      count++;
    }
  }
  printf("fuzz_replay: %d input(s) replayed, no finding\n", count);
  return bad || count == 0;
}
