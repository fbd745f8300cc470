"""The scheduler service: the store, the cycle, attempts, users, projects and the Hub; knows backends only through their seam."""
