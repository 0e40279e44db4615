fn main() {
    print!("{}", composer_coord::openapi::json());
}
