/* LOGGER_LEVEL values: the reference's numbers and names, and what is refused. */
#include "check.h"
#include "log_level.h"

static void numbers(void)
{
    CHECK_INT(vgpu_log_parse_level("0"), VGPU_LOG_FATAL);
    CHECK_INT(vgpu_log_parse_level("1"), VGPU_LOG_ERROR);
    CHECK_INT(vgpu_log_parse_level("2"), VGPU_LOG_WARNING);
    CHECK_INT(vgpu_log_parse_level("3"), VGPU_LOG_INFO);
    CHECK_INT(vgpu_log_parse_level("4"), VGPU_LOG_VERBOSE);
    CHECK_INT(vgpu_log_parse_level("5"), VGPU_LOG_DETAIL);
    CHECK_INT(vgpu_log_parse_level("9"), VGPU_LOG_DETAIL); /* the reference clamps above */
}

static void names(void)
{
    CHECK_INT(vgpu_log_parse_level("fatal"), VGPU_LOG_FATAL);
    CHECK_INT(vgpu_log_parse_level("ERROR"), VGPU_LOG_ERROR);
    CHECK_INT(vgpu_log_parse_level("Warning"), VGPU_LOG_WARNING);
    CHECK_INT(vgpu_log_parse_level("warn"), VGPU_LOG_WARNING);
    CHECK_INT(vgpu_log_parse_level("info"), VGPU_LOG_INFO);
    CHECK_INT(vgpu_log_parse_level("verbose"), VGPU_LOG_VERBOSE);
    CHECK_INT(vgpu_log_parse_level("debug"), VGPU_LOG_VERBOSE);
    CHECK_INT(vgpu_log_parse_level("DETAIL"), VGPU_LOG_DETAIL);
    CHECK_STR(vgpu_log_level_name(VGPU_LOG_FATAL), "FATAL");
    CHECK_STR(vgpu_log_level_name(VGPU_LOG_VERBOSE), "verbose");
}

static void default_and_refused(void)
{
    CHECK_INT(vgpu_log_parse_level(NULL), VGPU_LOG_WARNING);
    CHECK_INT(vgpu_log_parse_level(""), VGPU_LOG_WARNING);
    CHECK_INT(vgpu_log_parse_level("loud"), -1);
    CHECK_INT(vgpu_log_parse_level("-1"), -1);
    CHECK_INT(vgpu_log_parse_level("3x"), -1);
    CHECK_INT(vgpu_log_parse_level(" 3"), -1);
}

int main(void)
{
    RUN(numbers);
    RUN(names);
    RUN(default_and_refused);
    return check_summary("test_log_level");
}
