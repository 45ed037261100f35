package remote_test

const serverEnv = "FERRY_REMOTE_SERVER"

func serverMain(dir string) int { return 0 }
