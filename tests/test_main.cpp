// Catch2 entry point for the CPU and GPU test executables.
#include <catch2/catch_session.hpp>

int main(int argc, char** argv) { return Catch::Session().run(argc, argv); }
