// Compiled only to make the precompiled header every test reuses
// (tests/CMakeLists.txt, muster_test_pch).
