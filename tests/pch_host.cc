// Hosts the tests' precompiled header (TOWERFLOW_PCH in tests/CMakeLists.txt); never run.
int main() { return 0; }
