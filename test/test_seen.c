/* test_seen: the count of captures and the trust in streams' handles that
 * the interposer hands tidepool (src/common/seen.c), given up before the
 * platform is chosen: the platform must then ask about captures and stream
 * ids on every call, and say so. */
#include <string.h>

#include "check.h"
#include "common/hot.h"
#include "common/seen.h"

/* The interposer watched, then could not put its hooks in place (a driver
 * name called before its table was filled), all before the first call into
 * the library: streams of the program's must be asked their ids (a handle
 * may name a new stream after an unseen destruction), and the report must
 * tell why. The platform used to trust the handles again as it was
 * chosen. */
static void test_unwatched_before_choice(void) {
  tp__seen_watch();
  tp__seen_watch_streams();
  tp__seen_unwatch("a test gave up");
  REQUIRE(tp_platform_name() != NULL);
  CHECK(!atomic_load(&tp__hot.foreign_watched));
  bool counted = true, streams_seen = true;
  const char *why = NULL;
  tp__seen_state(&counted, &streams_seen, &why);
  CHECK(!counted);
  CHECK(!streams_seen);
  CHECK(why && strcmp(why, "a test gave up") == 0);
  /* And the calls ask: a capture question stays possible. */
  const _Atomic uint32_t *count = tp__seen_counter();
  CHECK(count == NULL || atomic_load(count) > 0);
}

int main(void) {
  RUN_TEST(test_unwatched_before_choice);
  return check_done();
}
