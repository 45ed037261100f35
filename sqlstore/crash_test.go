package sqlstore_test
const crashChildEnv = "FERRY_SQLSTORE_CRASH_CHILD"
func crashChild() int { return 0 }
