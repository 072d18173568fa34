// main() of the CPU test binary: runs every suite, then prints one closing line that CI reads,
// "tests: N passed, N failed, N skipped".
#include <gtest/gtest.h>

#include <cstdio>

int main(int argc, char** argv) {
    testing::InitGoogleTest(&argc, argv);
    // the file-reader tests expect the program to exit; fork+exec keeps that safe with OpenMP threads
    GTEST_FLAG_SET(death_test_style, "threadsafe");
    int rc = RUN_ALL_TESTS();
    const testing::UnitTest& unit = *testing::UnitTest::GetInstance();
    // successful_test_count() already leaves the skipped tests out
    printf("tests: %d passed, %d failed, %d skipped\n", unit.successful_test_count(), unit.failed_test_count(),
           unit.skipped_test_count());
    return rc;
}
